"""The discrete-event simulator: policies and engine cores in virtual time."""

from heddle.sim.bound import lower_bound
from heddle.sim.metrics import SimResult
from heddle.sim.simulator import Simulator, simulate

__all__ = ["SimResult", "Simulator", "lower_bound", "simulate"]
