"""The runtime: the processes that run Heddle's workflows and engines (the worker, the
engine host with its scheduler service, the embedded stack). Above the workflows and
activities, below the client, the CLI and the simulator."""
