"""Engines: the cost model, the clockless engine core, simulated and vLLM engines."""
