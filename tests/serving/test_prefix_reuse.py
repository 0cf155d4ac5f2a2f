"""Conversation reuse (serving/prefix_cache.py, scheduler.keep, slots' held/adopt): a prompt
that starts with a finished sequence's tokens prefills only the tokens after them. The rules
alone (longest prefix, least recently used out, the running before the cached), then the real
tiny GroupQueryAttention engine of test_continuous_batching: a prefill after an adopted prefix
gives the whole prompt's logits (GQA with a nonzero past on this onnxruntime), and a replica
with the cache on replies token for token as one with it off while each next turn prefills
only its new tokens."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pipeline.generation.sampling import SamplingParams
from pipeline.serving.prefix_cache import PrefixCache
from pipeline.serving.scheduler import Limits, Scheduler, Sequence
from tests.conftest import FAST_OPT, shared_build
from tests.serving.test_continuous_batching import EOS, RECIPE, _drive, _replica, _reply

NEWLINE = ord("\n")  # the byte conversation's end of a reply


# ---------------------------------------------------------------------- the rules alone
def test_the_longest_shared_prefix_is_found_and_the_least_recently_used_goes_first():
    cache = PrefixCache()
    cache.insert([1, 2, 3, 4, 5, 6], "a")
    cache.insert([1, 2, 9, 9], "b")
    hit = cache.match([1, 2, 3, 4, 7, 7, 7])
    assert (hit.entry.kv, hit.length) == ("a", 4)  # ends mid-entry, not at a block edge
    assert cache.match([1, 2, 3, 4, 5, 6]).length == 5  # the last token is always prefilled
    assert cache.match([8, 1, 2]) is None
    assert (cache.queried_tokens, cache.hit_tokens) == (16, 9)
    cache.insert([1, 2, 3, 4, 5, 6, 10, 11], "a, then a turn")  # supersedes "a"
    assert [e.kv for e in cache.entries] == ["b", "a, then a turn"] and cache.tokens == 12
    cache.insert([1, 2, 9], "within b")  # already held whole: b is touched, nothing added
    assert len(cache.entries) == 2
    cache.evict_to(8)  # "a, then a turn" is now the least recently used
    assert [e.kv for e in cache.entries] == ["b"] and cache.evicted == 1


def test_cached_prefixes_give_way_to_running_sequences():
    """A budget of 30 tokens: a finished 15-token sequence is kept; a request of 25 is still
    admitted (the prefix evicted, not the request refused), and one that extends the kept
    tokens takes them."""
    s = Scheduler(Limits(max_running=2, kv_tokens=30, slot_tokens=30), PrefixCache())
    first = s.submit(Sequence(list(range(10, 20)), SamplingParams(5)))
    s.plan()
    for token in (21, 22, 23, 24, 25):
        s.append(first, token, EOS)
    s.retire()
    s.keep(first.prompt + first.tokens[:-1], "kv of 14")
    assert s.kv_cached == 14 and s.kv_free == 30
    turn = s.submit(Sequence(first.prompt + first.tokens + [26], SamplingParams(4)))
    assert s.plan().admitted == [turn] and turn.reused == 14 and turn.reuse.entry.kv == "kv of 14"
    # 20 reserved leave 10 for prefixes: the entry goes, its copy still on its way to the slot
    assert s.kv_free == 10 and s.kv_cached == 0 and s.prefix_cache.evicted == 1
    s.append(turn, 27, EOS)
    s.cancel(turn)
    s.retire()
    big = s.submit(Sequence(list(range(50, 70)), SamplingParams(5)))
    s.keep(list(range(10, 24)), "kv of 14 again")
    assert s.plan().admitted == [big] and big.reused == 0
    assert s.kv_free == 5 and s.kv_cached == 0 and s.prefix_cache.evicted == 2



def test_the_prefill_budget_counts_only_the_tokens_after_a_cached_prefix():
    """A budget of 10: two next turns of a kept 14-token conversation (5 new tokens each) are
    admitted in one iteration, a fresh prompt of 6 waits for the next; a head that waits is
    looked up again then but counted once."""
    s = Scheduler(Limits(max_running=4, kv_tokens=200, slot_tokens=40, prefill_tokens=10), PrefixCache())
    s.keep(list(range(10, 24)), "kv of 14")
    turns = [s.submit(Sequence(list(range(10, 24)) + [30 + i] * 5, SamplingParams(4))) for i in range(2)]
    fresh = s.submit(Sequence(list(range(60, 66)), SamplingParams(4)))
    assert s.plan().admitted == turns and [t.reused for t in turns] == [14, 14]
    assert s.prefix_cache.queried_tokens == 38  # the fresh prompt was looked at, not counted
    assert s.plan().admitted == [fresh] and fresh.reused == 0
    assert s.prefix_cache.queried_tokens == 44 and s.prefix_cache.hit_tokens == 28

# ---------------------------------------------------------------------- the real engine
@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    return shared_build(tmp_path_factory, "tiny-llama-gqa", "tiny-llama-gqa", *FAST_OPT,
                        recipes={"recipes/tiny-llama-gqa.yaml": RECIPE})


@pytest.mark.slow
def test_a_prefill_after_an_adopted_prefix_gives_the_whole_prompts_logits(gqa):
    """20 tokens prefilled at once, against 12 of them copied out of a finished slot into a
    new one and the other 8 prefilled on top (a past of 12); the next decode step agrees too."""
    from pipeline.generation.runners import OrtLoopRunner
    from pipeline.generation.slots import BatchedSlots

    loop = OrtLoopRunner(gqa.built / "onnxruntime.onnx", eos=EOS, threads=1)
    prompt = np.random.default_rng(5).integers(3, 256, size=20)
    whole = BatchedSlots(loop, 1, 65)
    expected = [whole.prefill(0, prompt), whole.decode([0], np.array([7]))[0]]
    slots = BatchedSlots(loop, 2, 65)
    slots.prefill(0, np.concatenate([prompt[:12], [200, 201, 202]]))  # diverges after 12
    held = slots.held(0)
    slots.release(0)
    slots.adopt(3, held, 12)
    assert held.length == 15 and slots.length == {3: 12}
    got = [slots.prefill(3, prompt[12:]), slots.decode([3], np.array([7]))[0]]
    for a, b in zip(expected, got):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def _common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _held(prompt: list[int], reply: list[int], final) -> list[int]:
    """What a finished slot holds: the prompt and every reply token fed back (the last one of
    a reply cut at max_new_tokens never was)."""
    return prompt + (reply if final["finish_reason"] == "stop" else reply[:-1])


async def _chat(replica, questions: list[str], new_tokens: int) -> list[tuple[list[int], list[int], dict]]:
    """A conversation through the byte chat template: each turn carries the replies so far
    (their text, as a chat client sends it) -> [(prompt, reply, final)] per turn."""
    from pipeline.data.tokenizer import Tokenizer

    tok, messages, turns = Tokenizer(), [], []
    for question in questions:
        messages.append({"role": "user", "content": question})
        prompt = tok.conversation(messages)
        reply, final = await _reply(replica, prompt, SamplingParams(new_tokens, stop_token_ids=(NEWLINE,)))
        messages.append({"role": "assistant", "content": tok.decode(reply)})
        turns.append((prompt, reply, final))
    return turns


async def _continue(replica, start: list[int], news: list[list[int]], new_tokens: int):
    """A conversation by token ids (as a completions client appends): each turn's prompt is
    the last prompt, its reply, then new ids -> [(prompt, reply, final)] per turn."""
    prompt, turns = start, []
    for i, new in enumerate([[], *news]):
        if i:
            prompt = turns[-1][0] + turns[-1][1] + new
        reply, final = await _reply(replica, prompt, SamplingParams(new_tokens, ignore_eos=True))
        turns.append((prompt, reply, final))
    return turns


@pytest.mark.slow
def test_a_next_turn_prefills_only_its_new_tokens_and_replies_as_without_reuse(gqa):
    """Three conversations at once, turns interleaved: two through the chat template (two turns
    each), one by token ids (three turns). With the prefix cache every later turn takes the
    conversation the replica holds and prefills only the rest; every reply equals the one the
    same requests get with the cache off (fp32, greedy)."""
    rng = np.random.default_rng(11)
    ids = [rng.integers(3, 256, size=n).tolist() for n in (8, 6, 6)]

    async def main(replica):
        turns = await asyncio.gather(_chat(replica, ["2+2?", "3x4?"], 6),
                                     _chat(replica, ["Hi", "Why?"], 6),
                                     _continue(replica, ids[0], ids[1:], 8))
        return turns, replica.stats()["generation"], replica.metrics.exposition()[0].decode()

    with_reuse, stats, metrics = _drive(_replica(gqa), main)
    without, stats_off, _ = _drive(_replica(gqa, prefix_cache=False), main)
    assert [[(p, r) for p, r, _ in conv] for conv in with_reuse] == \
           [[(p, r) for p, r, _ in conv] for conv in without]
    prefilled = 0
    for conv in with_reuse:
        assert conv[0][2]["cached_tokens"] == 0 or conv[0][2]["cached_tokens"] <= 10  # "Question: "
        prefilled += len(conv[0][0]) - conv[0][2]["cached_tokens"]
        for (prompt, reply, final), (next_prompt, _, next_final) in zip(conv, conv[1:]):
            held = _held(prompt, reply, final)
            assert next_final["cached_tokens"] == _common(held, next_prompt) >= len(prompt)
            prefilled += len(next_prompt) - next_final["cached_tokens"]
    by_ids = with_reuse[2]
    for next_prompt, _, next_final in by_ids[1:]:
        assert len(next_prompt) - next_final["cached_tokens"] == 6 + 1  # the new ids + the reply's last
    assert stats["prefill_tokens"] == prefilled
    assert stats_off["prefill_tokens"] == sum(len(p) for conv in without for p, _, _ in conv)
    assert stats["prefill_tokens"] < stats_off["prefill_tokens"] and stats_off["prefix_cache"] is None
    hits = stats["prefix_cache"]["hit_tokens"]
    assert hits == stats_off["prefill_tokens"] - stats["prefill_tokens"]
    assert f'pipeline:prefix_cache_hits_total{{model_name="tiny-llama-gqa"}} {float(hits)}' in metrics
    # what the kept prefixes hold, in bytes: a soak judges its leak on the memory they do not explain
    held = stats["prefix_cache"]["tokens"] * stats["kv_bytes_per_token"]
    assert held > 0 and f'pipeline:prefix_cache_bytes{{model_name="tiny-llama-gqa"}} {float(held)}' in metrics


@pytest.mark.slow
def test_under_a_small_kv_budget_prefixes_are_evicted_and_every_request_completes(gqa):
    """A budget of 60 tokens over 2 slots: kept conversations are evicted as requests of up to
    30 tokens come, none is refused, and a turn whose prefix went is prefilled whole and still
    replies as without reuse."""
    rng = np.random.default_rng(12)
    starts = [rng.integers(3, 256, size=12).tolist() for _ in range(6)]
    extra = rng.integers(3, 256, size=4).tolist()

    async def main(replica):
        firsts = await asyncio.gather(*(_reply(replica, s, SamplingParams(8, ignore_eos=True)) for s in starts))
        turn = starts[0] + firsts[0][0] + extra  # the oldest conversation: evicted by now
        return firsts, await _reply(replica, turn, SamplingParams(8, ignore_eos=True)), replica.stats()["generation"]

    firsts, (tokens, final), stats = _drive(_replica(gqa, max_running_sequences=2, kv_cache_tokens=60), main)
    _, (off_tokens, _), _ = _drive(_replica(gqa, max_running_sequences=2, kv_cache_tokens=60,
                                            prefix_cache=False), main)
    assert all(len(t) == 8 for t, _ in firsts) and tokens == off_tokens and len(tokens) == 8
    cache = stats["prefix_cache"]
    assert cache["evicted"] >= 1 and cache["tokens"] <= 60
    assert final["cached_tokens"] < 12 + 7  # its conversation was evicted (another may share a token)
