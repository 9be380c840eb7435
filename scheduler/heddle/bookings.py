"""The predicted remaining work booked on each instance: what balances trajectories
among instances of one width, and what tells which block holds least."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Bookings:
    _work: dict[str, float] = field(default_factory=dict)
    _where: dict[str, str] = field(default_factory=dict)
    _booked: dict[str, float] = field(default_factory=dict)

    def book(self, tid: str, instance_id: str, remaining: float) -> None:
        """Book a trajectory's predicted remaining work on the instance it runs on."""
        self.release(tid)
        self._where[tid] = instance_id
        self._booked[tid] = remaining
        self._work[instance_id] = self._work.get(instance_id, 0.0) + remaining

    def release(self, tid: str) -> None:
        old = self._where.pop(tid, None)
        if old is not None:
            self._work[old] -= self._booked.pop(tid, 0.0)

    def work_on(self, instance_id: str, excluding: str = "", its_remaining: float = 0.0) -> float:
        """Predicted remaining tokens booked on an instance, less `excluding`'s (its
        current forecast, `its_remaining`) when it is booked there."""
        work = self._work.get(instance_id, 0.0)
        if self._where.get(excluding) == instance_id:
            work -= its_remaining
        return work
