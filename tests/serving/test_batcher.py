"""The dynamic batcher's rules under a fake clock (Triton's dynamic_batching semantics), the
request checks and padding of collate.py, and the `serve:` recipe section. No Ray, no engine."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.recipe.serve import batching, buckets, variable_dims
from pipeline.serving import collate
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


# ----------------------------------------------------------------------------- collate
class _Dim:
    def __init__(self, name, lo, opt, hi):
        self.name, self.min, self.opt, self.max = name, lo, opt, hi


def _recipe(serve: dict | None = None):
    from pipeline.recipe.schema import Recipe

    dims = [{"name": "batch", "min": 1, "opt": 2, "max": 8}, {"name": "sequence", "min": 2, "opt": 16, "max": 32}]
    return Recipe.model_validate({
        "model": {"factory": "m:build"},
        "inputs": [{"name": "input_ids", "dtype": "int64", "shape": dims, "range": [0, 100]},
                   {"name": "attention_mask", "dtype": "int64", "shape": dims, "range": [1, 2]}],
        "outputs": ["hidden"], "targets": [{"kind": "onnxruntime"}], "serve": serve or {}})


def test_serve_defaults_follow_the_batch_dim_and_powers_of_two_buckets():
    r = _recipe()
    assert batching(r.serve, r.inputs) == (8, (2, 8))
    assert buckets(r.serve, "sequence", variable_dims(r.inputs)["sequence"]) == [2, 4, 8, 16, 32]
    r = _recipe({"max_batch_size": 4, "preferred_batch_sizes": [], "length_buckets": {"sequence": [10]}})
    assert batching(r.serve, r.inputs) == (4, ())
    assert buckets(r.serve, "sequence", variable_dims(r.inputs)["sequence"]) == [10, 32]


@pytest.mark.parametrize("serve, words", [
    ({"max_batch_size": 16}, "exceeds what the engine accepts"),
    ({"preferred_batch_sizes": [9]}, "exceed max_batch_size"),
    ({"length_buckets": {"tokens": [4]}}, "not a variable-length dim"),
    ({"length_buckets": {"sequence": [64]}}, "outside the dim's"),
    ({"max_queue_delay_us": -1}, "greater than or equal"),
])
def test_a_serve_section_that_cannot_hold_is_refused_naming_the_key(serve, words):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=words):
        _recipe(serve)


def test_serve_settings_do_not_change_the_recipe_digest():
    assert _recipe().digest == _recipe({"max_batch_size": 2, "max_queue_size": 5}).digest


def _sig(**serve):
    r = _recipe(serve)
    return collate.Signature.of(r, output_axes={"hidden": {1: "sequence"}})


@pytest.mark.parametrize("inputs, words", [
    ({"input_ids": [[1, 2, 3]]}, "missing: ['attention_mask']"),
    ({"input_ids": [[1, 2]], "attention_mask": [[1, 1]], "x": [1]}, "unknown: ['x']"),
    ({"input_ids": [[1.5, 2]], "attention_mask": [[1, 1]]}, "non-integer"),
    ({"input_ids": [[1, 2], [3, 4]], "attention_mask": [[1, 1], [1, 1]]}, "batch size 2"),
    ({"input_ids": [1, 2], "attention_mask": [1, 1]}, "needs 2 dims"),
    ({"input_ids": [[1] * 40], "attention_mask": [[1] * 40]}, "2..32"),
    ({"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1]]}, "must agree"),
    ({"input_ids": [[1, [2]]], "attention_mask": [[1, 1]]}, "rectangular"),
    ({"input_ids": [["a", "b"]], "attention_mask": [[1, 1]]}, "numbers"),
])
def test_a_request_that_does_not_fit_is_one_clear_line(inputs, words):
    with pytest.raises(collate.BadRequest, match=words.replace("[", r"\[").replace("]", r"\]")):
        collate.check(_sig(), inputs)


def test_an_npz_array_must_have_the_inputs_dtype_exactly():
    arrays = {"input_ids": np.ones((1, 4), np.int32), "attention_mask": np.ones((1, 4), np.int64)}
    with pytest.raises(collate.BadRequest, match="dtype int32"):
        collate.check(_sig(), arrays)


def test_requests_are_padded_to_their_bucket_stacked_and_cut_back():
    sig = _sig(pad_values={"input_ids": 7}, length_buckets={"sequence": [8]})
    a, la = collate.check(sig, {"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1, 1]]})
    b, lb = collate.check(sig, {"input_ids": [[4, 5, 6, 7, 8]], "attention_mask": [[1] * 5]})
    assert collate.bucket(sig, la) == collate.bucket(sig, lb) == (("sequence", 8),)
    feed = collate.stack(sig, [a, b], (("sequence", 8),))
    assert feed["input_ids"].tolist() == [[1, 2, 3, 7, 7, 7, 7, 7], [4, 5, 6, 7, 8, 7, 7, 7]]
    assert feed["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1] * 5 + [0] * 3]
    hidden = np.arange(2 * 8 * 3).reshape(2, 8, 3).astype(np.float32)
    first, second = collate.split(sig, {"hidden": hidden}, [la, lb])
    assert first["hidden"].shape == (1, 3, 3) and second["hidden"].shape == (1, 5, 3)
    assert np.array_equal(second["hidden"][0], hidden[1, :5])


def test_with_batches_of_one_nothing_is_padded():
    sig = _sig(max_batch_size=1)
    _, lengths = collate.check(sig, {"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1, 1]]})
    assert collate.bucket(sig, lengths) == (("sequence", 3),)
