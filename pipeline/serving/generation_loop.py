"""Continuous batching in one replica: the scheduler's rules (scheduler.py) driven by an
asyncio loop, the engine's slots (generation/slots.py) on the replica's one engine thread.

    loop = GenerationLoop(engine, spec, pool, metrics)
    async for item in loop.generate(prompt_ids, params): ...   # {"token"}... then {"done"}

Each iteration: finished and cancelled sequences leave (their slots freed), waiting ones are
admitted (within the prefill budget), each admitted prompt is prefilled alone (its first token
goes to its client at once), then decode steps run for every running sequence, one engine call
each. Tokens are chosen per row with each request's own SamplingParams and generator
(sampling.next_token), on the engine thread; the scheduler is only touched from the event loop,
which never blocks.
Decode steps run back to back on the engine thread while nothing changes the running set: each
step's tokens go to the event loop (call_soon_threadsafe, applied there in order), and the
engine thread goes back to the loop only after a step in which a sequence finished, or when a
request arrived or went away (`_interrupt`, set by every submit and cancel). A round trip per
step (the engine thread waking the loop, the loop waking the engine thread) cost ~0.75 ms a
token on the shared 2-core machine: what the old loop added to each step.
With `serve.prefix_cache` (on by default), a finished sequence's keys and values are kept
(scheduler.keep) and a prompt that starts with kept tokens prefills only the rest: a chat's
next turn prefills its new message, not the conversation again.
An engine whose cache cannot hold rows at different lengths (the PyTorch baseline, an ONNX
graph that concatenates its cache) runs through the same loop one sequence at a time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from pipeline.core.json_object import JsonObject
from pipeline.generation.sampling import SamplingParams, ends_sequence, next_token
from pipeline.generation.slots import HeldKV
from pipeline.serving.prefix_cache import PrefixCache
from pipeline.serving.scheduler import Limits, Scheduler, Sequence

# Sequences decoded together by default on an engine that batches them: the closed-loop
# benchmark (benchmarks/serve_chat.py, docs/serving.md) measured SmolLM2 INT4 on 2 cores up to
# 16 concurrent streams; the KV cache of 16 slots is 16 x context x bytes_per_token.
DEFAULT_MAX_RUNNING = 16
# Prompt tokens prefilled between two decode steps by default (scheduler.py's prefill budget):
# about one chat prompt (SmolLM2's shipped questions: 38 tokens through the template), so a
# burst of arrivals is interleaved with decode steps (benchmarks/results/serve_chat-after-2026-12-05.md).
DEFAULT_PREFILL_TOKENS = 64


@dataclass(eq=False)
class _Stream:
    """One request's channel to its client and its timings (time.perf_counter seconds)."""

    seq: Sequence
    rng: np.random.Generator
    arrived: float
    items: asyncio.Queue = field(default_factory=asyncio.Queue)  # token ids, then None or an error
    admitted: float | None = None
    first: float | None = None
    end: float | None = None


class GenerationLoop:
    def __init__(self, engine, spec, pool, metrics=None):
        """engine: a ServedEngine of a generation recipe; spec: the recipe's ServeSpec; pool:
        the replica's one engine thread; metrics: a ServingMetrics (or None)."""
        wanted = spec.max_running_sequences or DEFAULT_MAX_RUNNING
        self.slots, self.one_at_a_time = engine.slots(wanted)
        width, rows = self.slots.width, self.slots.rows
        # the default budget is every slot full: only a smaller kv_cache_tokens binds
        budget = DEFAULT_PREFILL_TOKENS if spec.prefill_tokens_per_step is None else spec.prefill_tokens_per_step
        limits = Limits(rows, spec.kv_cache_tokens or rows * width, width, spec.max_queue_size, budget)
        # slots that keep their own cache (OneSlot) cannot hand a prefix to another sequence
        reuse = spec.prefix_cache and hasattr(self.slots, "adopt")
        self.scheduler = Scheduler(limits, PrefixCache() if reuse else None)
        self.prefill_tokens = 0               # prompt tokens prefilled (not taken from the cache)
        self.eos, self.pool, self.metrics = engine.eos, pool, metrics
        self._streams: dict[int, _Stream] = {}
        self._wake: asyncio.Event | None = None
        self._interrupt = threading.Event()  # a submit or a cancel: decode steps go back to the loop
        self.back_to_back = True  # False: one decode step per iteration (benchmarks/serve_chat.py's "before")
        self._task: asyncio.Task | None = None
        self.steps: dict[int, int] = {}       # sequences in a decode step -> steps
        self.engine_seconds = {"prefill": 0.0, "decode": 0.0}  # the engine thread's busy time
        self.finished: dict[str, int] = {}    # finish_reason -> requests
        self._state()

    # ------------------------------------------------------------------ requests
    async def generate(self, prompt_ids: list[int], params: SamplingParams):
        """Replica.generate's iterator (its docstring has the items). Submits on the first
        anext: NeverFits or QueueFull come before any item."""
        seq = self.scheduler.submit(Sequence(list(prompt_ids), params))
        stream = _Stream(seq, params.generator(), time.perf_counter())
        self._streams[seq.id] = stream
        self._kick()
        try:
            while (item := await stream.items.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield {"token": item}
        finally:
            if seq.finish_reason is None:  # the client went away (aclose, disconnect)
                self.scheduler.cancel(seq)
                self._kick()
                self._finished(stream)
        yield self._summary(stream)

    def _summary(self, stream: _Stream) -> JsonObject:
        seq, ms = stream.seq, 1e3
        n, first, end = len(seq.tokens), stream.first, stream.end
        return {"done": True, "tokens": n, "finish_reason": seq.finish_reason,
                "prompt_tokens": len(seq.prompt), "cached_tokens": seq.reused,
                "queue_ms": (stream.admitted - stream.arrived) * ms,
                "ttft_ms": (first - stream.arrived) * ms if first else None,
                "tpot_ms": (end - first) * ms / (n - 1) if n > 1 else None,
                "e2e_ms": (end - stream.arrived) * ms}

    def _kick(self) -> None:
        """Wakes the loop; starts it on the running event loop (again, after an engine failure
        stopped it, or when another event loop drives the replica now: a test's asyncio.run)."""
        running = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not running:
            self._wake = asyncio.Event()
            self._task = running.create_task(self._loop())
        self._wake.set()
        self._interrupt.set()

    # ------------------------------------------------------------------ the loop
    async def _loop(self) -> None:
        try:
            await self._iterations()
        except Exception as e:  # a bug of the loop itself: no client may wait forever
            for stream in list(self._streams.values()):
                stream.items.put_nowait(e)
            raise

    async def _iterations(self) -> None:
        while True:
            # the finished leave (their prefixes kept) before admission, so a next turn that
            # arrived meanwhile finds its conversation
            await self._release(self.scheduler.retire())
            self._interrupt.clear()  # no await until plan(): a later submit interrupts the steps
            plan = self.scheduler.plan()
            await self._release(plan.released)
            self._count_reuse(plan.admitted)
            if self.scheduler.idle:
                self._state()
                self._wake.clear()  # no await since idle was read: no submit can be missed
                await self._wake.wait()
                continue
            self._state()  # the admitted hold their KV while they prefill: /metrics shows it
            for seq in plan.admitted:
                self._streams[seq.id].admitted = time.perf_counter()
                if not seq.done:  # cancelled while it waited for its prefill
                    await self._engine(self._prefill, [seq])
            await self._release(self.scheduler.retire())  # finished at their first token
            batch = self.scheduler.decoding()
            if batch:
                if self.scheduler.can_admit:  # the prefill budget left some: one step, then them
                    self._interrupt.set()
                await self._engine(self._decode_steps, batch, self._step_done)
            self._state()

    async def _release(self, seqs: list[Sequence]) -> None:
        if seqs:
            kept = await asyncio.get_running_loop().run_in_executor(self.pool, self._free, seqs)
            for tokens, held in kept:
                self.scheduler.keep(tokens, held)

    def _free(self, seqs: list[Sequence]) -> list[tuple[list[int], HeldKV]]:
        """Engine thread: frees the sequences' slots; with a prefix cache, first copies out
        what each one that ended well (stop, length) holds -> [(its token ids, the copy)]."""
        kept = []
        for seq in seqs:
            if (self.scheduler.prefix_cache is not None and seq.finish_reason in ("stop", "length")
                    and seq.slot in self.slots.length):
                held = self.slots.held(seq.slot)
                kept.append(((seq.prompt + seq.tokens)[:held.length], held))
            self.slots.release(seq.slot)
        return kept

    def _count_reuse(self, admitted: list[Sequence]) -> None:
        if self.metrics and self.scheduler.prefix_cache is not None:
            for seq in admitted:
                self.metrics.gen_prefix_cache(len(seq.prompt), seq.reused)

    async def _engine(self, call, seqs: list[Sequence], apply=None) -> None:
        """`call(seqs, rngs, loop) -> tokens` on the engine thread; the tokens it returns are
        applied and sent (`apply`: `_apply` by default). A call that raises fails `seqs`."""
        rngs = [self._streams[s.id].rng for s in seqs]
        loop = asyncio.get_running_loop()
        try:
            tokens = await loop.run_in_executor(self.pool, call, seqs, rngs, loop)
        except Exception as e:  # the engine failed: these requests are told, the loop goes on
            self.scheduler.fail(seqs)
            for seq in seqs:
                stream = self._streams.pop(seq.id, None)
                if stream is not None:
                    stream.items.put_nowait(e)
                    if self.metrics:
                        self.metrics.gen_failure()
            return
        (apply or self._apply)(seqs, tokens, time.perf_counter())

    def _apply(self, seqs: list[Sequence], tokens: list[int], now: float) -> None:
        """Event loop: each sequence's new token applied (scheduler.append) and sent."""
        for seq, token in zip(seqs, tokens):
            stream = self._streams.get(seq.id)
            if stream is None or seq.cancelled or seq.finish_reason is not None:
                continue
            if self.scheduler.append(seq, token, self.eos):
                stream.first = stream.first or now
                stream.items.put_nowait(token)
            if seq.finish_reason is not None:
                stream.end = now
                self._finished(stream)
                stream.items.put_nowait(None)

    def _step_done(self, seqs: list[Sequence], tokens: list[int], now: float) -> None:
        """Event loop: one decode step's tokens, sent by the engine thread."""
        self._apply(seqs, tokens, now)
        self.steps[len(seqs)] = self.steps.get(len(seqs), 0) + 1
        if self.metrics:
            self.metrics.gen_step(len(seqs))

    def _prefill(self, seqs: list[Sequence], rngs: list, loop=None) -> list[int]:
        """Engine thread: the prompt into its slot at batch 1 -> the first token; a prompt
        with a cached prefix starts from its copy and prefills only the tokens after it."""
        (seq,), (rng,) = seqs, rngs
        t0 = time.perf_counter()
        if seq.reuse is not None:
            self.slots.adopt(seq.slot, seq.reuse.entry.kv, seq.reused)
            seq.reuse = None  # the copy is made: the entry may go
        new = seq.prompt[seq.reused:]
        logits = self.slots.prefill(seq.slot, np.asarray(new, np.int64))  # [V]
        self.prefill_tokens += len(new)
        token = next_token(logits, seq.params, rng, self.eos)
        self._engine_time("prefill", time.perf_counter() - t0)
        return [token]

    def _decode_steps(self, seqs: list[Sequence], rngs: list, loop) -> list[int]:
        """Engine thread: decode steps for `seqs` until a step in which one of them finishes
        (the scheduler's rules: EOS or a stop id, max_new_tokens), or a submit or cancel asks
        the loop to plan again: that step's tokens are returned (applied by the loop task, which
        then retires the finished before its next await, as after any engine call); each step
        before it is sent to the event loop at once (`_step_done`). The last token of each
        sequence is tracked here: the event loop applies them later."""
        last = [s.tokens[-1] for s in seqs]
        room = [s.params.max_new_tokens - len(s.tokens) for s in seqs]  # tokens each may still add
        while True:
            tokens = self._decode(seqs, rngs, last)
            room = [r - 1 for r in room]
            if (not self.back_to_back or self._interrupt.is_set() or min(room) <= 0
                    or any(ends_sequence(t, s.params, self.eos) for t, s in zip(tokens, seqs))):
                return tokens
            loop.call_soon_threadsafe(self._step_done, seqs, tokens, time.perf_counter())
            last = tokens

    def _decode(self, seqs: list[Sequence], rngs: list, last: list[int]) -> list[int]:
        """Engine thread: each sequence's last token in one call -> logits [n, V] -> a token each."""
        t0 = time.perf_counter()
        logits = self.slots.decode([s.slot for s in seqs], np.array(last, np.int64))
        tokens = [next_token(row, s.params, rng, self.eos) for row, s, rng in zip(logits, seqs, rngs)]
        self._engine_time("decode", time.perf_counter() - t0)
        return tokens

    def _engine_time(self, phase: str, seconds: float) -> None:
        """Engine thread: `seconds` more of `phase` ("prefill" or "decode")."""
        self.engine_seconds[phase] += seconds
        if self.metrics:
            self.metrics.gen_engine(**{f"{phase}_s": seconds})

    # ------------------------------------------------------------------ bookkeeping
    def _finished(self, stream: _Stream) -> None:
        """A request ended (stop, length or abort): counted once, its stream forgotten."""
        if self._streams.pop(stream.seq.id, None) is None:
            return
        seq = stream.seq
        reason = seq.finish_reason or "abort"
        stream.end = stream.end or time.perf_counter()
        stream.admitted = stream.admitted or stream.end
        self.finished[reason] = self.finished.get(reason, 0) + 1
        if self.metrics:
            n, first = len(seq.tokens), stream.first
            self.metrics.gen_finished(reason, len(seq.prompt), n, stream.admitted - stream.arrived,
                                      first - stream.arrived if first else None, stream.end - stream.arrived,
                                      (stream.end - first) / (n - 1) if n > 1 else None)

    def _state(self) -> None:
        if self.metrics:
            s = self.scheduler
            self.metrics.gen_state(len(s.running), len(s.waiting), s.kv_reserved, s.limits.kv_tokens,
                                   s.kv_cached, self.slots.bytes_per_token or 0)

    def stats(self) -> JsonObject:
        s = self.scheduler
        return {"running": len(s.running), "waiting": len(s.waiting),
                "max_running_sequences": s.limits.max_running, "one_at_a_time": self.one_at_a_time,
                "kv_cache_tokens": s.limits.kv_tokens, "kv_tokens_reserved": s.kv_reserved,
                "kv_tokens_held": s.kv_held, "kv_tokens_free": s.kv_free,
                "slot_tokens": s.limits.slot_tokens, "kv_bytes_per_token": self.slots.bytes_per_token,
                "decode_steps": {str(k): v for k, v in sorted(self.steps.items())},
                "prefill_tokens": self.prefill_tokens, "prefix_cache": self._prefix_stats(),
                "engine_seconds": dict(self.engine_seconds),
                "finished": dict(sorted(self.finished.items()))}

    def _prefix_stats(self) -> JsonObject | None:
        cache = self.scheduler.prefix_cache
        if cache is None:
            return None
        return {"entries": len(cache.entries), "tokens": cache.tokens, "queried_tokens": cache.queried_tokens,
                "hit_tokens": cache.hit_tokens, "evicted": cache.evicted}

    def close(self) -> None:
        self._interrupt.set()  # decode steps on the engine thread stop after the current one
        if self._task is not None:
            self._task.cancel()
        for stream in list(self._streams.values()):
            stream.items.put_nowait(RuntimeError("the replica is shutting down"))
        self._streams.clear()
