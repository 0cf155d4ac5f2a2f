"""Continuous batching on a real engine: a tiny Llama (random weights, GQA 4/2) whose graph is
fused into ONNX Runtime's GroupQueryAttention (the cache in place), built once. The slots
decode rows at different lengths as each alone; a replica's greedy replies do not depend on
their batch-mates; EOS ends a reply; more requests than slots all complete within the KV
budget; a client that goes away frees its slot; a full queue refuses. Every wait is on an
event or on the replica's own progress, never a fixed sleep."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from tests.conftest import FAST_OPT, shared_build

pytestmark = pytest.mark.slow

EOS = 2  # the config's eos_token_id
RECIPE = """\
description: tiny Llama, GQA 4/2, random weights, GroupQueryAttention (the KV cache in place)
model:
  transformers:
    config: {model_type: llama, vocab_size: 256, hidden_size: 64, intermediate_size: 128,
             num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
             max_position_embeddings: 512, bos_token_id: 1, eos_token_id: 2}
    seed: 0
    task: logits
inputs:
  - name: input_ids
    dtype: int64
    shape:
      - {name: batch, min: 1, opt: 1, max: 2}
      - {name: sequence, min: 1, opt: 8, max: 64}
    range: [0, 256]
outputs: [logits]
export: {parity: {max_abs: 1.0e-3, cosine_min: 0.9999}}
optimize:
  passes: [fold_constants, attention_with_past, ort_fusions, pack_matmuls, group_query_attention]
  options: {group_query_attention: {max_positions: 512}}
data: {calibration: null}
targets: [{kind: onnxruntime}]
workload:
  kind: generation
  prompt_lengths: [8]
  new_tokens: 4
  batch_sizes: [1]
  task: [{prompt: 6, new_tokens: 3}]
  long: {prompt: 40, new_tokens: 24, bins: 1}   # the context a slot holds: 64 (+1)
"""


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    return shared_build(tmp_path_factory, "tiny-llama-gqa", "tiny-llama-gqa", *FAST_OPT,
                        recipes={"recipes/tiny-llama-gqa.yaml": RECIPE})


def _replica(gqa, **serve):
    from pipeline.recipe.serve import ServeSpec
    from pipeline.serving.replica import Replica
    from pipeline.store.folder_names import load

    sets = tuple(FAST_OPT[i + 1] for i in range(0, len(FAST_OPT), 2))
    recipe = load(str(gqa.path / "recipes" / "tiny-llama-gqa.yaml"), sets, gqa.engines)
    spec = ServeSpec.model_validate({**recipe.serve.model_dump(exclude_unset=True), **serve})
    return Replica(recipe, gqa.engines, None, spec, threads=1)


def _drive(replica, main):
    """asyncio.run(main(replica)), the replica closed after."""
    async def run():
        try:
            return await main(replica)
        finally:
            replica.close()
    return asyncio.run(run())


async def _reply(replica, prompt, params, got_tokens: asyncio.Event | None = None, after: int = 1):
    """(tokens, the final item); `got_tokens` is set once `after` tokens came."""
    tokens, final = [], None
    async for item in replica.generate(prompt, params):
        if "token" in item:
            tokens.append(item["token"])
            if got_tokens is not None and len(tokens) >= after:
                got_tokens.set()
        else:
            final = item
    if got_tokens is not None:
        got_tokens.set()  # a reply shorter than `after` releases its waiters too
    return tokens, final


def _requests(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """n prompts of 2..30 tokens, each with its own max_new_tokens (1..34, within the 65 a slot holds)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        prompt = rng.integers(3, 256, size=int(rng.integers(2, 31))).tolist()
        out.append((prompt, int(rng.integers(1, 65 - len(prompt)))))
    return out


def test_slots_decode_rows_at_different_lengths_as_each_alone(gqa):
    """Rows of 3, 9 and 14 tokens in one decode call give each row's batch-1 logits; when the
    middle one leaves, the last row moves into its place and still decodes the same."""
    from pipeline.generation.runners import OrtLoopRunner
    from pipeline.generation.slots import BatchedSlots

    loop = OrtLoopRunner(gqa.built / "onnxruntime.onnx", eos=EOS, threads=1)
    rng = np.random.default_rng(3)
    prompts = {slot: rng.integers(3, 256, size=n) for slot, n in ((5, 3), (1, 9), (7, 14))}
    steps = rng.integers(3, 256, size=(2, 3))
    alone = {}
    for slot, prompt in prompts.items():
        one = BatchedSlots(loop, 1, 65)
        first = one.prefill(0, prompt)
        alone[slot] = [first, *(one.decode([0], steps[i, [list(prompts).index(slot)]])[0] for i in range(2))]
    many = BatchedSlots(loop, 4, 65)
    got = {slot: [many.prefill(slot, p)] for slot, p in prompts.items()}
    order = list(prompts)
    for slot, row in zip(order, many.decode(order, steps[0])):
        got[slot].append(row)
    many.release(1)  # the middle row: the last (slot 7) moves into it
    assert many.slot_at == [5, 7]
    for slot, row in zip([7, 5], many.decode([7, 5], steps[1, [2, 0]])):
        got[slot].append(row)
    for slot in (5, 7):
        for a, b in zip(alone[slot], got[slot]):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    assert len(got[1]) == 2 and np.abs(alone[1][1] - got[1][1]).max() < 1e-5


def test_greedy_replies_do_not_depend_on_batch_mates(gqa):
    """32 requests of different prompt lengths and max_new_tokens, in four waves of eight:
    a wave arrives when a request of the last one has its third token, so requests join a
    batch whose rows are at other positions. Every reply equals the same request served alone."""
    from pipeline.generation.sampling import SamplingParams

    requests = _requests(32)

    async def main(replica):
        alone = [await _reply(replica, p, SamplingParams(n, ignore_eos=True)) for p, n in requests]
        waves = [requests[i:i + 8] for i in range(0, 32, 8)]
        tasks = []
        for wave in waves:
            third = asyncio.Event()
            tasks += [asyncio.create_task(_reply(replica, p, SamplingParams(n, ignore_eos=True), third, 3))
                      for p, n in wave]
            await third.wait()
        together = await asyncio.gather(*tasks)
        return alone, together, replica.stats()["generation"]

    alone, together, stats = _drive(_replica(gqa), main)
    for (prompt, n), (a, _), (b, final) in zip(requests, alone, together):
        assert len(a) == n and a == b, f"prompt of {len(prompt)}, {n} new tokens"
        assert final["finish_reason"] == "length" and final["tokens"] == n
        assert final["prompt_tokens"] == len(prompt) and final["e2e_ms"] >= final["queue_ms"] >= 0
    assert max(int(k) for k in stats["decode_steps"]) >= 8, stats["decode_steps"]
    assert stats["running"] == 0 and stats["kv_tokens_reserved"] == 0 and stats["finished"] == {"length": 64}


def test_the_engine_threads_prefill_and_decode_time_is_counted_in_stats_and_metrics(gqa):
    """What a load point's TPOT is made of: the engine thread's seconds in prefills and in
    decode steps, the same figures in the replica's stats and in /metrics, within the wall
    time the requests took."""
    import re
    import time

    from pipeline.generation.sampling import SamplingParams

    requests = _requests(4, seed=5)

    async def main(replica):
        t0 = time.perf_counter()
        await asyncio.gather(*(_reply(replica, p, SamplingParams(n, ignore_eos=True)) for p, n in requests))
        wall = time.perf_counter() - t0
        return wall, replica.stats()["generation"], replica.metrics.exposition()[0].decode()

    wall, stats, metrics = _drive(_replica(gqa), main)
    busy = stats["engine_seconds"]
    assert busy["prefill"] > 0 and busy["decode"] > 0
    assert busy["prefill"] + busy["decode"] <= wall
    for phase in ("prefill", "decode"):
        counted = re.search(rf'^pipeline:engine_{phase}_seconds_total{{model_name="tiny-llama-gqa"}} (\S+)$',
                            metrics, re.M)
        assert counted and float(counted.group(1)) == pytest.approx(busy[phase]), phase


def test_a_burst_is_prefilled_a_prompt_per_step_and_each_reply_is_as_alone(gqa):
    """Eight requests of 2..30 prompt tokens submitted at once, with a prefill budget of 1
    token a step: one prompt is prefilled per iteration and a decode step runs between, so the
    batch grows 1, 2, ..., 8 (a step of each size) while the first ones already decode; every
    reply equals the same request served alone, and so do they with no budget (all prefilled
    before the first step: its batch is all eight)."""
    from pipeline.generation.sampling import SamplingParams

    requests = [(p, max(n, 9)) for p, n in _requests(8, seed=4)]

    async def main(replica):
        alone = [await _reply(replica, p, SamplingParams(n, ignore_eos=True)) for p, n in requests]
        before = dict(replica.generation.steps)
        together = await asyncio.gather(*(_reply(replica, p, SamplingParams(n, ignore_eos=True))
                                          for p, n in requests))
        steps = {k: v - before.get(k, 0) for k, v in replica.generation.steps.items()}
        return [a for a, _ in alone], [b for b, _ in together], steps

    shortest = min(n for _, n in requests)
    for budget in (1, 0):
        alone, together, steps = _drive(_replica(gqa, prefill_tokens_per_step=budget, prefix_cache=False), main)
        assert alone == together, f"budget {budget}"
        if budget:  # joined one by one, the first ones decoding meanwhile
            assert all(steps.get(k) for k in range(1, 9)), steps
        else:       # all eight decode together until the shortest reply ends
            assert steps.get(8) == shortest - 1, steps

def test_a_request_arriving_while_steps_run_back_to_back_joins_at_the_next_step(gqa):
    """A reply of 60 tokens decodes back to back on the engine thread; a request submitted
    while its fourth decode step runs ends that run after the step: the newcomer is prefilled
    next, the two decode together from the step after, and both replies are as alone.
    The engine's calls are recorded as they pass (the real slots run them); the fourth step is
    held until the submit is in, so the order is the scheduler's, not the machine's (with the
    two racing, a busy machine let 30 steps pass before the event loop submitted)."""
    from pipeline.generation.sampling import SamplingParams

    long, short = ([5, 6, 7], SamplingParams(60, ignore_eos=True)), ([9, 10, 11, 12], SamplingParams(5, ignore_eos=True))
    replica = _replica(gqa, prefix_cache=False)  # each prompt prefilled whole: the calls below say so
    loop_, slots = replica.generation, replica.generation.slots
    real_decode, real_prefill = slots.decode, slots.prefill
    calls: list[tuple[str, int]] = []  # engine thread: ("decode", rows) / ("prefill", prompt tokens)
    held, release = threading.Event(), threading.Event()

    def decode(rows, tokens):
        calls.append(("decode", len(rows)))
        if calls.count(("decode", 1)) == 4 and not release.is_set():  # the fourth step waits for the submit
            held.set()
            assert release.wait(60), "the test never released the held step"
        return real_decode(rows, tokens)

    def prefill(slot, tokens):
        calls.append(("prefill", len(tokens)))
        return real_prefill(slot, tokens)

    async def main(replica):
        alone = [await _reply(replica, *long), await _reply(replica, *short)]
        calls.clear()
        slots.decode, slots.prefill = decode, prefill
        first_run = asyncio.create_task(_reply(replica, *long))
        assert await asyncio.to_thread(held.wait, 60), "the long reply never reached its fourth step"
        second = asyncio.create_task(_reply(replica, *short))
        while len(loop_.scheduler.waiting) + len(loop_.scheduler.running) < 2 and not second.done():
            # submitted on its first step (a submit that raised ends the wait: `await second` raises it)
            await asyncio.sleep(0)
        release.set()
        return alone, await first_run, await second

    alone, (long_reply, _), (short_reply, _) = _drive(replica, main)
    assert long_reply == alone[0][0] and short_reply == alone[1][0]
    # the long prompt's prefill, three steps alone, the held fourth, then the newcomer's prefill
    assert calls[:6] == [("prefill", 3)] + [("decode", 1)] * 4 + [("prefill", 4)], calls
    assert calls[6:10] == [("decode", 2)] * 4, calls  # its 4 decode steps beside the long reply

def test_seeded_sampling_does_not_depend_on_batch_mates_either(gqa):
    from pipeline.generation.sampling import SamplingParams

    requests = _requests(6, seed=1)
    params = [SamplingParams(n, temperature=0.8, top_p=0.9, top_k=50, seed=i, ignore_eos=True)
              for i, (_, n) in enumerate(requests)]

    async def main(replica):
        alone = [await _reply(replica, p, q) for (p, _), q in zip(requests, params)]
        together = await asyncio.gather(*(_reply(replica, p, q) for (p, _), q in zip(requests, params)))
        return alone, together

    alone, together = _drive(_replica(gqa), main)
    assert [a for a, _ in alone] == [b for b, _ in together]


def test_a_reply_stops_at_end_of_sequence_unless_asked_to_ignore_it(gqa):
    """A reply ends where greedy decoding chooses EOS, which it does not return; asked to
    ignore EOS, the same prompt's reply is that reply and more (EOS masked out), and among
    batch-mates the reply stops at the same token."""
    from pipeline.generation.sampling import SamplingParams

    async def main(replica):
        for seed in range(300):  # a prompt whose greedy reply says EOS after a few tokens
            prompt = np.random.default_rng(seed).integers(3, 256, size=6).tolist()
            tokens, final = await _reply(replica, prompt, SamplingParams(40))
            if final["finish_reason"] == "stop" and len(tokens) >= 2:
                break
        else:
            pytest.fail("no reply of 300 stopped at EOS")
        forced = await _reply(replica, prompt, SamplingParams(40, ignore_eos=True))
        with_mates = await asyncio.gather(*(_reply(replica, p, SamplingParams(n)) for p, n in _requests(5)),
                                          _reply(replica, prompt, SamplingParams(40)))
        return (tokens, final), forced, with_mates[-1]

    (tokens, final), (forced, forced_final), (mated, _) = _drive(_replica(gqa), main)
    assert final["tokens"] == len(tokens) < 40 and EOS not in tokens
    assert forced[:len(tokens)] == tokens == mated and forced[len(tokens)] != EOS
    assert forced_final["finish_reason"] == "length" and len(forced) == 40


def test_more_requests_than_slots_all_complete_within_the_kv_budget(gqa):
    from pipeline.generation.sampling import SamplingParams

    requests = [(list(range(3, 3 + k)), 10) for k in (8, 11, 9, 12, 10, 8, 12, 9, 11, 10)]

    async def main(replica):
        return (await asyncio.gather(*(_reply(replica, p, SamplingParams(n, ignore_eos=True))
                                       for p, n in requests)), replica.stats()["generation"])

    # 3 slots, but 45 tokens of budget: two of these (18..22 tokens each) run at once, never three
    replies, stats = _drive(_replica(gqa, max_running_sequences=3, kv_cache_tokens=45), main)
    assert all(len(tokens) == 10 and final["finish_reason"] == "length" for tokens, final in replies)
    assert max(int(k) for k in stats["decode_steps"]) == 2
    assert stats["max_running_sequences"] == 3 and stats["kv_cache_tokens"] == 45
    assert stats["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # k+v x layers x kv heads x head_dim x fp32


def test_a_client_that_goes_away_frees_its_slot(gqa):
    """One slot: a long reply is abandoned after two tokens; the next request gets the slot."""
    from pipeline.generation.sampling import SamplingParams

    async def main(replica):
        items = replica.generate([5, 6, 7], SamplingParams(60, ignore_eos=True))
        assert "token" in await anext(items) and "token" in await anext(items)
        await items.aclose()
        tokens, final = await _reply(replica, [9, 10], SamplingParams(4, ignore_eos=True))
        return tokens, final, replica.stats()["generation"]

    tokens, final, stats = _drive(_replica(gqa, max_running_sequences=1), main)
    assert len(tokens) == 4 and final["finish_reason"] == "length"
    assert stats["finished"] == {"abort": 1, "length": 1} and stats["running"] == 0


def test_a_full_queue_refuses_and_an_impossible_request_is_a_bad_request(gqa):
    from pipeline.generation.sampling import SamplingParams
    from pipeline.serving.batcher import QueueFull
    from pipeline.serving.collate import BadRequest

    async def main(replica):
        running = replica.generate([5, 6], SamplingParams(60, ignore_eos=True))
        assert "token" in await anext(running)  # it holds the one slot
        waiting = asyncio.create_task(_reply(replica, [7, 8], SamplingParams(3, ignore_eos=True)))
        while not replica.generation.scheduler.waiting:  # until its submit ran
            await asyncio.sleep(0)
        with pytest.raises(QueueFull):
            await anext(replica.generate([9], SamplingParams(3)))
        with pytest.raises(BadRequest, match="context"):
            await anext(replica.generate([9] * 30, SamplingParams(40)))
        await running.aclose()
        return await waiting

    tokens, final = _drive(_replica(gqa, max_running_sequences=1, max_queue_size=1), main)
    assert len(tokens) == 3 and final["queue_ms"] > 0


def test_a_503_says_when_to_retry():
    from pipeline.serving import http_api

    refused = http_api._error(503, "queue full")
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "retry-after" not in http_api._error(400, "bad").headers


def test_the_pytorch_baseline_is_served_one_sequence_at_a_time_through_the_same_loop(gqa):
    """--engine pytorch: the static cache holds one sequence, so the loop runs with one slot
    (the stats say why); concurrent requests all complete, each as the baseline alone."""
    from pipeline.generation.sampling import SamplingParams
    from pipeline.recipe.serve import ServeSpec
    from pipeline.serving.replica import Replica

    base = _replica(gqa)
    recipe, engines = base.recipe, gqa.engines
    base.close()
    requests = _requests(3, seed=2)

    async def main(replica):
        alone = [await _reply(replica, p, SamplingParams(n, ignore_eos=True)) for p, n in requests]
        together = await asyncio.gather(*(_reply(replica, p, SamplingParams(n, ignore_eos=True))
                                          for p, n in requests))
        return alone, together, replica.stats()["generation"], replica.metrics.exposition()[0].decode()

    spec = ServeSpec.model_validate({**recipe.serve.model_dump(exclude_unset=True), "max_running_sequences": 8})
    alone, together, stats, metrics = _drive(Replica(recipe, engines, "pytorch", spec, threads=1), main)
    assert [a for a, _ in alone] == [b for b, _ in together]
    assert all(len(t) == n for (t, _), (_, n) in zip(together, requests))
    assert stats["max_running_sequences"] == 1 and "PyTorch" in stats["one_at_a_time"]
    assert set(stats["decode_steps"]) == {"1"}
    assert 'pipeline:request_success_total{finished_reason="length",model_name="tiny-llama-gqa"} 6.0' in metrics


def test_an_engine_failure_ends_its_requests_and_the_loop_goes_on(gqa):
    """A prefill that raises (planted once) fails only its own request; its slot is free again
    and the requests decoding beside it, and the ones after, complete."""
    from pipeline.generation.sampling import SamplingParams

    async def main(replica):
        slots = replica.generation.slots
        real = slots.prefill

        def fails_once(slot, tokens):
            slots.prefill = real
            raise RuntimeError("planted engine failure")

        running = replica.generate([5, 6, 7], SamplingParams(30, ignore_eos=True))
        first = await anext(running)
        slots.prefill = fails_once
        with pytest.raises(RuntimeError, match="planted"):
            await _reply(replica, [8, 9], SamplingParams(5))
        rest = [item async for item in running]
        after = await _reply(replica, [8, 9], SamplingParams(5, ignore_eos=True))
        return first, rest, after, replica.stats()["generation"]

    first, rest, (tokens, final), stats = _drive(_replica(gqa, max_running_sequences=2), main)
    assert "token" in first and rest[-1]["finish_reason"] == "length" and rest[-1]["tokens"] == 30
    assert len(tokens) == 5 and final["finish_reason"] == "length"
    assert stats["running"] == 0 and stats["kv_tokens_reserved"] == 0


def test_the_served_engine_spins_only_inside_a_call_unless_told_not_to(gqa):
    """serve.spin (default on): the replica's ONNX Runtime workers spin-wait within a call and
    stop when it returns (force_spinning_stop); serve.spin false: they sleep between kernels."""
    def config(replica) -> dict[str, str]:
        options = replica.engine._gen.session.get_session_options()
        out = {}
        for key in ("session.intra_op.allow_spinning", "session.force_spinning_stop"):
            try:
                out[key] = options.get_session_config_entry(key)
            except RuntimeError:  # not set: ONNX Runtime's default
                out[key] = None
        return out

    on, off = _replica(gqa), _replica(gqa, spin=False)
    try:
        assert config(on) == {"session.intra_op.allow_spinning": "1", "session.force_spinning_stop": "1"}
        assert config(off) == {"session.intra_op.allow_spinning": "0", "session.force_spinning_stop": None}
    finally:
        on.close()
        off.close()
