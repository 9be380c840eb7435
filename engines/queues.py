"""Waiting-queue orders for the engine core, as strategy objects (vLLM `create_request_queue`).

Priority values follow vLLM and Temporal: lower runs first.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import Protocol

from engines.request import EngineRequest


class RequestQueue(Protocol):
    def push(self, request: EngineRequest) -> None: ...
    def peek(self) -> EngineRequest: ...
    def pop(self) -> EngineRequest: ...
    def remove(self, request_id: str) -> EngineRequest | None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[EngineRequest]: ...


def rank(request: EngineRequest) -> tuple[int, int]:
    """Order of service under the priority policy: priority, then arrival."""
    return (request.priority, request.arrival_seq)


class FCFSQueue:
    """First come, first served; a preempted request goes back to the front."""

    def __init__(self) -> None:
        self._items: deque[EngineRequest] = deque()

    def push(self, request: EngineRequest) -> None:
        if request.num_preemptions:
            self._items.appendleft(request)
        else:
            self._items.append(request)

    def peek(self) -> EngineRequest:
        return self._items[0]

    def pop(self) -> EngineRequest:
        return self._items.popleft()

    def remove(self, request_id: str) -> EngineRequest | None:
        for request in self._items:
            if request.request_id == request_id:
                self._items.remove(request)
                return request
        return None

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[EngineRequest]:
        return iter(self._items)


class PriorityQueue:
    """Lowest (priority, arrival) first."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, EngineRequest]] = []

    def push(self, request: EngineRequest) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_seq, request))

    def peek(self) -> EngineRequest:
        return self._heap[0][2]

    def pop(self) -> EngineRequest:
        return heapq.heappop(self._heap)[2]

    def remove(self, request_id: str) -> EngineRequest | None:
        for i, (_, _, request) in enumerate(self._heap):
            if request.request_id == request_id:
                self._heap.pop(i)
                heapq.heapify(self._heap)
                return request
        return None

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[EngineRequest]:
        return (item[2] for item in sorted(self._heap, key=lambda x: x[:2]))


QUEUES: dict[str, type[FCFSQueue] | type[PriorityQueue]] = {
    "fcfs": FCFSQueue,
    "priority": PriorityQueue,
}


def create_request_queue(policy: str) -> FCFSQueue | PriorityQueue:
    try:
        return QUEUES[policy]()
    except KeyError:
        raise ValueError(f"unknown queue policy {policy!r}; valid: {sorted(QUEUES)}") from None
