"""serving/batcher.py: the dynamic batcher's rules under a fake clock (Triton's
dynamic_batching semantics). No Ray, no engine."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.serving.batcher import Batcher, BatchPolicy, QueueFull


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _batcher(**policy) -> tuple[Batcher, FakeClock]:
    clock = FakeClock()
    return Batcher(BatchPolicy(**policy), clock), clock


def _items(batch) -> list:
    return [q.item for q in batch]


def test_a_partial_batch_waits_for_the_max_queue_delay_then_goes_whole():
    b, clock = _batcher(max_batch_size=4, max_queue_delay_us=1000)
    b.submit("a")
    clock.now = 0.0004
    b.submit("b")
    assert b.take() is None and b.wake_in() == pytest.approx(0.0006)
    clock.now = 0.000999
    assert b.take() is None
    clock.now = 0.001  # the oldest request has waited the delay: everything queued goes
    batch = b.take()
    assert _items(batch) == ["a", "b"] and len(b) == 0 and b.wake_in() is None
    assert batch[0].queue_s() == pytest.approx(0.001) and batch[1].queue_s() == pytest.approx(0.0006)


def test_a_full_batch_goes_at_once_in_arrival_order_and_the_rest_waits():
    b, clock = _batcher(max_batch_size=4, max_queue_delay_us=10_000)
    for name in "abcde":
        b.submit(name)
    assert _items(b.take()) == ["a", "b", "c", "d"]
    assert b.take() is None and b.wake_in() == pytest.approx(0.01)
    clock.now = 0.01
    assert _items(b.take()) == ["e"]


def test_the_largest_preferred_size_the_queue_fills_goes_without_waiting():
    b, _ = _batcher(max_batch_size=8, max_queue_delay_us=10**6, preferred_batch_sizes=(2, 3))
    b.submit(0)
    assert b.take() is None  # 1 is no preferred size: wait
    b.submit(1)
    assert _items(b.take()) == [0, 1]
    for i in range(2, 7):
        b.submit(i)
    assert _items(b.take()) == [2, 3, 4]  # 5 queued: the largest preferred <= 5 is 3
    assert _items(b.take()) == [5, 6]
    assert b.take() is None and len(b) == 0


def test_without_preferred_sizes_only_max_batch_size_or_the_delay_sends():
    b, clock = _batcher(max_batch_size=3, max_queue_delay_us=500)
    b.submit(0)
    b.submit(1)
    assert b.take() is None
    b.submit(2)
    assert len(b.take()) == 3


def test_zero_delay_sends_whatever_is_queued_at_once():
    b, _ = _batcher(max_batch_size=8, max_queue_delay_us=0)
    b.submit("x")
    assert _items(b.take()) == ["x"]


def test_the_bounded_queue_refuses_one_more_and_takes_again_once_drained():
    b, clock = _batcher(max_batch_size=2, max_queue_delay_us=100, max_queue_size=3)
    for i in range(3):
        b.submit(i)
    with pytest.raises(QueueFull):
        b.submit(3)
    assert len(b) == 3  # the refused request was never queued
    assert _items(b.take()) == [0, 1]
    b.submit(4)
    clock.now = 1.0
    assert _items(b.take()) == [2, 4]


def test_buckets_batch_apart_and_the_oldest_bucket_goes_first():
    b, clock = _batcher(max_batch_size=2, max_queue_delay_us=1000)
    b.submit("a16", bucket=16)
    clock.now = 0.0001
    b.submit("b32", bucket=32)
    b.submit("c16", bucket=16)
    b.submit("d32", bucket=32)
    # both buckets are full: the one whose oldest request arrived first goes first
    assert _items(b.take()) == ["a16", "c16"]
    assert _items(b.take()) == ["b32", "d32"]
    b.submit("e16", bucket=16)
    b.submit("f64", bucket=64)
    b.submit("g64", bucket=64)
    assert _items(b.take()) == ["f64", "g64"]  # a full later bucket does not wait for an older one
    clock.now = 1.0
    assert _items(b.take()) == ["e16"]


def test_drain_returns_what_is_left_in_arrival_order():
    b, _ = _batcher(max_batch_size=4, max_queue_delay_us=10**6)
    b.submit(1, bucket="x")
    b.submit(2, bucket="y")
    b.submit(3, bucket="x")
    assert [q.item for q in b.drain()] == [1, 2, 3] and len(b) == 0 and b.take() is None


def test_a_policy_with_preferred_sizes_above_the_max_is_refused():
    with pytest.raises(ValueError):
        BatchPolicy(max_batch_size=4, preferred_batch_sizes=(8,))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.003), st.sampled_from([8, 16])), min_size=1, max_size=40),
       st.integers(1, 5), st.integers(0, 2000), st.sampled_from([(), (2,), (2, 3)]))
def test_a_server_that_takes_when_told_serves_everyone_once_in_order_within_the_delay(
        arrivals, max_batch, delay_us, preferred):
    """Simulated arrivals (gap, bucket) against a server that asks at every arrival and
    whenever wake_in says: each request is served once, FIFO per bucket, in batches of at
    most max_batch_size, and none waits longer than the delay (compute takes no time)."""
    preferred = tuple(n for n in preferred if n <= max_batch)
    b, clock = _batcher(max_batch_size=max_batch, max_queue_delay_us=delay_us,
                        preferred_batch_sizes=preferred)
    served = []

    def drain_due():
        while (batch := b.take()) is not None:
            assert 1 <= len(batch) <= max_batch and len({q.bucket for q in batch}) == 1
            served.extend(batch)

    t = 0.0
    for i, (gap, bucket) in enumerate(arrivals):
        t += gap
        while (wait := b.wake_in()) is not None and clock.now + wait <= t:
            clock.now += wait
            drain_due()
        clock.now = t
        b.submit(i, bucket)
        drain_due()
    while (wait := b.wake_in()) is not None:
        clock.now += wait
        drain_due()
    assert sorted(q.item for q in served) == list(range(len(arrivals)))
    for bucket in (8, 16):
        mine = [q.item for q in served if q.bucket == bucket]
        assert mine == sorted(mine)
    assert all(q.queue_s() <= delay_us / 1e6 + 1e-12 for q in served)


