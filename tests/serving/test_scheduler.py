"""Continuous batching's rules (serving/scheduler.py), pure: admission up to max_running and the
KV budget in arrival order, the bounded queue, cancellation freeing a slot, and a sequence
finishing at EOS, a stop id or max_new_tokens."""

from __future__ import annotations

import pytest

from pipeline.generation.sampling import SamplingParams
from pipeline.serving.batcher import QueueFull
from pipeline.serving.scheduler import Limits, NeverFits, Scheduler, Sequence

EOS = 2


def _seq(prompt: int, new: int, **params) -> Sequence:
    return Sequence(list(range(10, 10 + prompt)), SamplingParams(new, **params))


def _scheduler(max_running=2, kv_tokens=1000, slot_tokens=100, max_waiting=0) -> Scheduler:
    return Scheduler(Limits(max_running, kv_tokens, slot_tokens, max_waiting))


def test_admission_stops_at_max_running_and_resumes_when_one_finishes():
    s = _scheduler(max_running=2)
    a, b, c = (s.submit(_seq(4, 3)) for _ in range(3))
    plan = s.plan()
    assert plan.admitted == [a, b] and plan.released == [] and list(s.waiting) == [c]
    assert (a.slot, b.slot) == (0, 1) and s.decoding() == [a, b]
    for token in (7, 8, 9):
        s.append(a, token, EOS)
    assert a.finish_reason == "length" and a.tokens == [7, 8, 9] and s.decoding() == [b]
    plan = s.plan()
    assert plan.released == [a] and plan.admitted == [c] and c.slot == 0  # a's slot, reused


def test_the_kv_budget_admits_in_arrival_order_and_counts_prompt_plus_max_new_tokens():
    s = _scheduler(max_running=4, kv_tokens=30)
    big, small, later = s.submit(_seq(10, 10)), s.submit(_seq(5, 10)), s.submit(_seq(2, 2))
    assert s.plan().admitted == [big]           # 20 reserved; small (15) does not fit in 10
    assert s.kv_reserved == 20 and s.kv_free == 10 and s.kv_held == 10
    assert s.plan().admitted == []              # later (4) fits, but does not pass small: FCFS
    s.append(big, 5, EOS)
    s.append(big, 6, EOS)
    assert s.kv_held == 11                      # the prompt and the fed token; 6 is fed next step
    s.cancel(big)
    assert s.plan().admitted == [small, later] and s.kv_reserved == 19


def test_a_sequence_that_could_never_fit_is_refused_at_submit():
    s = _scheduler(kv_tokens=50, slot_tokens=40)
    with pytest.raises(NeverFits, match="context of 40 tokens"):
        s.submit(_seq(30, 11))
    s.submit(_seq(30, 10))  # exactly the slot
    with pytest.raises(NeverFits, match="KV cache budget of 50"):
        Scheduler(Limits(2, 50, 100)).submit(_seq(30, 21))


def test_the_queue_is_bounded_beyond_the_slots_the_next_iteration_fills():
    s = _scheduler(max_running=2, max_waiting=1)
    running = [s.submit(_seq(2, 4)) for _ in range(3)]  # two take the free slots, one waits
    with pytest.raises(QueueFull):
        s.submit(_seq(2, 4))
    s.plan()
    assert s.decoding() == running[:2] and len(s.waiting) == 1
    with pytest.raises(QueueFull):
        s.submit(_seq(2, 4))
    s.cancel(running[2])  # a waiting client that goes away leaves the queue at once
    assert not s.waiting and running[2].finish_reason == "abort"
    s.submit(_seq(2, 4))


def test_a_cancelled_running_sequence_is_not_decoded_and_frees_its_slot():
    s = _scheduler(max_running=1)
    a, b = s.submit(_seq(3, 50)), s.submit(_seq(3, 5))
    s.plan()
    s.append(a, 11, EOS)
    s.cancel(a)
    assert s.decoding() == [] and a.finish_reason is None
    plan = s.plan()
    assert plan.released == [a] and a.finish_reason == "abort" and plan.admitted == [b] and b.slot == 0
    assert s.kv_reserved == b.reserved


def test_eos_and_stop_ids_finish_a_sequence_without_returning_the_token():
    s = _scheduler(max_running=3)
    plain, ignoring, stopping = s.submit(_seq(2, 5)), s.submit(_seq(2, 5, ignore_eos=True)), \
        s.submit(_seq(2, 5, stop_token_ids=(40,)))
    s.plan()
    assert s.append(plain, 30, EOS) and not s.append(plain, EOS, EOS)
    assert plain.tokens == [30] and plain.finish_reason == "stop"
    assert s.append(ignoring, EOS, EOS) and ignoring.tokens == [EOS] and ignoring.finish_reason is None
    assert not s.append(stopping, 40, EOS) and stopping.tokens == [] and stopping.finish_reason == "stop"
    assert s.decoding() == [ignoring]


def test_a_sequence_finished_at_its_first_token_leaves_before_the_decode_step():
    s = _scheduler(max_running=2)
    one, more = s.submit(_seq(2, 1)), s.submit(_seq(2, 4))
    s.plan()
    s.append(one, 9, EOS)  # its prefill's token is its last
    s.append(more, 9, EOS)
    assert s.retire() == [one] and s.decoding() == [more] and one.finish_reason == "length"


def test_idle_and_invalid_limits():
    s = _scheduler()
    assert s.idle
    seq = s.submit(_seq(2, 1))
    assert not s.idle
    s.plan()
    s.append(seq, 5, EOS)
    s.plan()
    assert s.idle
    with pytest.raises(ValueError):
        Limits(0, 10, 10)


def test_the_prefill_budget_admits_a_burst_a_prompt_or_so_per_iteration_in_arrival_order():
    """A budget of 20 prompt tokens: the first admission of an iteration always fits (even a
    prompt of 30), later ones while their prompts fit what is left; the rest wait, in order,
    for the next iteration (after a decode step). 0 admits every one that fits the slots."""
    s = Scheduler(Limits(max_running=8, kv_tokens=1000, slot_tokens=100, prefill_tokens=20))
    seqs = [s.submit(_seq(n, 5)) for n in (30, 8, 12, 5, 6, 10)]
    assert s.plan().admitted == seqs[:1]       # 30 > 20, but the first always fits
    assert s.plan().admitted == seqs[1:3]      # 8 + 12 = 20
    assert s.plan().admitted == seqs[3:5]      # 5 + 6; 10 more would be 21
    assert s.plan().admitted == seqs[5:] and not s.waiting
    unbounded = Scheduler(Limits(max_running=8, kv_tokens=1000, slot_tokens=100))
    burst = [unbounded.submit(_seq(n, 5)) for n in (30, 8, 12, 5, 6, 9)]
    assert unbounded.plan().admitted == burst
    with pytest.raises(ValueError, match="invalid"):
        Limits(2, 10, 10, prefill_tokens=-1)
