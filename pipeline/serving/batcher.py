"""The dynamic batcher's rules, with Triton's `dynamic_batching` semantics: a pure core with
an injected clock (no Ray, no asyncio, no threads), so every rule is tested under a fake clock.

Rules (Triton's dynamic_batch_scheduler, per length bucket; `size` = requests queued):
  1. size >= max_batch_size: a batch of max_batch_size goes at once.
  2. else the largest preferred batch size <= size goes at once (none set: only rule 1).
  3. else, once the oldest request has waited max_queue_delay, all queued requests go.
  4. else nothing goes; `wake_in()` says when rule 3 fires next.
Requests leave in arrival order (FIFO): within a bucket, the oldest first; across buckets,
the bucket whose oldest request arrived first goes first. A submit beyond max_queue_size
requests queued (0: unbounded) raises QueueFull (HTTP 503), like Triton's queue policy.
A batch holds requests of one bucket only (they are padded to one shape and stacked).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

# Clock readings are floats: a wait of exactly `wake_in()` must find the delay expired, so
# the comparison forgives a nanosecond of rounding (else a loop could wake, take nothing and
# be told to wait 0 s forever).
_EPSILON = 1e-9


class QueueFull(Exception):
    """The bounded queue holds max_queue_size requests: the caller answers 503."""


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 0  # 0: unbounded

    def __post_init__(self):
        if self.max_batch_size < 1 or self.max_queue_delay_us < 0 or self.max_queue_size < 0:
            raise ValueError(f"invalid batch policy {self}")
        if any(not 1 <= n <= self.max_batch_size for n in self.preferred_batch_sizes):
            raise ValueError(f"preferred sizes {self.preferred_batch_sizes} must be within "
                             f"[1, {self.max_batch_size}]")

    @property
    def delay_s(self) -> float:
        return self.max_queue_delay_us / 1e6


@dataclass
class Queued:
    """One request waiting: what the caller submitted, its bucket, and when it arrived."""

    item: Any
    bucket: Hashable
    arrived: float           # clock() at submit, seconds
    order: int               # global arrival order (FIFO across buckets)
    taken: float | None = field(default=None)  # clock() when its batch left the queue

    def queue_s(self) -> float:
        return (self.taken if self.taken is not None else self.arrived) - self.arrived


class Batcher:
    """Queues requests by bucket and hands out batches by the rules above."""

    def __init__(self, policy: BatchPolicy, clock: Callable[[], float]):
        self.policy, self.clock = policy, clock
        self._queues: dict[Hashable, deque[Queued]] = {}
        self._order = itertools.count()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def submit(self, item: Any, bucket: Hashable = None) -> Queued:
        """Queue one request; QueueFull when the queue is at max_queue_size."""
        limit = self.policy.max_queue_size
        if limit and self._size >= limit:
            raise QueueFull(f"queue full ({limit} requests waiting)")
        queued = Queued(item, bucket, self.clock(), next(self._order))
        self._queues.setdefault(bucket, deque()).append(queued)
        self._size += 1
        return queued

    def _due(self, queue: deque[Queued], now: float) -> int:
        """How many requests of this bucket's queue go now (0: none yet)."""
        size, policy = len(queue), self.policy
        if size >= policy.max_batch_size:
            return policy.max_batch_size
        fitting = [n for n in policy.preferred_batch_sizes if n <= size]
        if fitting:
            return fitting[-1]
        if now - queue[0].arrived >= policy.delay_s - _EPSILON:
            return size
        return 0

    def take(self) -> list[Queued] | None:
        """The batch that goes now (oldest bucket first), removed from the queue; or None."""
        now = self.clock()
        ready = [(q[0].order, bucket, n) for bucket, q in self._queues.items()
                 if q and (n := self._due(q, now))]
        if not ready:
            return None
        _, bucket, n = min(ready, key=lambda r: r[0])
        queue = self._queues[bucket]
        batch = [queue.popleft() for _ in range(n)]
        if not queue:
            del self._queues[bucket]
        self._size -= n
        for q in batch:
            q.taken = now
        return batch

    def wake_in(self) -> float | None:
        """Seconds until rule 3 sends a batch (0: one is due now); None: the queue is empty."""
        if not self._size:
            return None
        now = self.clock()
        if any(self._due(q, now) for q in self._queues.values()):
            return 0.0
        oldest = min(q[0].arrived for q in self._queues.values())
        return max(0.0, oldest + self.policy.delay_s - now)

    def drain(self) -> list[Queued]:
        """Everything still queued, removed (at shutdown: each gets an error answer)."""
        left = sorted((q for queue in self._queues.values() for q in queue), key=lambda q: q.order)
        self._queues.clear()
        self._size = 0
        return left
