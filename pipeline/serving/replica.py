"""One serving replica: the engine, the batcher's pure rules driven by an asyncio loop on the
real clock, and what the replica measures about itself (load time, memory, batch sizes).

No Ray here: the Ray Serve deployment (app.py) holds one Replica and forwards to it, and the
tests drive a Replica directly too. The engine runs on one worker thread, one batch at a
time (a replica is one engine instance, as Triton's instance_group count 1); requests queue
in the batcher meanwhile, up to max_queue_size (then QueueFull: 503). A generation engine's
requests are batched continuously instead (generation_loop.py over scheduler.py's rules).
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.bench import monitor
from pipeline.core.json_object import JsonObject
from pipeline.generation.sampling import InvalidSampling, SamplingParams, check_vocab
from pipeline.serving import collate
from pipeline.serving.batcher import Batcher, BatchPolicy, QueueFull
from pipeline.serving.generation_loop import GenerationLoop
from pipeline.serving.metrics import ServingMetrics
from pipeline.serving.scheduler import NeverFits


class EngineFailed(RuntimeError):
    """The engine failed a request run alone: 422 when it ran the request's batch-mates (the
    request is what it refuses), 500 when it ran none of them."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.status = status

    @classmethod
    def of(cls, error: Exception, status: int) -> EngineFailed:
        text = str(error).strip().splitlines()
        what = "refused this request" if status == 422 else "failed"
        return cls(f"the engine {what}: {type(error).__name__}: {text[0] if text else ''}"[:500], status)

    def __reduce__(self):  # crosses Ray's process boundary with its status
        return type(self), (str(self), self.status)


@dataclass(frozen=True)
class InferAnswer:
    """One sample's outputs (batch dim 1, padded axes cut back) and what the replica measured."""

    outputs: dict[str, np.ndarray]  # output name -> array
    queue_ms: float    # arrival in the batcher's queue to its batch leaving it
    compute_ms: float  # the batch's engine call, shared by the batch
    batch_size: int    # requests in that batch

    def timings(self) -> dict[str, float]:
        """queue_ms, compute_ms, batch_size by name: the HTTP answers' timing fields."""
        return {"queue_ms": self.queue_ms, "compute_ms": self.compute_ms, "batch_size": self.batch_size}


def memory_mb() -> dict[str, float]:
    """This process's resident memory now and at its peak, MiB (bench/monitor reads /proc)."""
    rss, peak = monitor.rss_bytes(), monitor.peak_rss_bytes()
    return {"rss_mb": (rss or 0) / 2**20, "peak_rss_mb": (peak or 0) / 2**20}


class Replica:
    def __init__(self, recipe, engines_root: Path, engine: str | None, spec, threads: int | None):
        from pipeline.serving.engine import ServedEngine, choose, output_axes

        start = time.perf_counter()
        self.choice = choose(recipe, engines_root, engine)
        self.engine = ServedEngine(recipe, self.choice, threads, spec.spin)
        self.recipe, self.spec = recipe, spec
        self.signature = collate.Signature.of(recipe, spec, output_axes(recipe, self.choice.graph))
        self.policy = BatchPolicy(self.signature.max_batch_size, spec.max_queue_delay_us,
                                  self.signature.preferred, spec.max_queue_size)
        self.batcher = Batcher(self.policy, time.monotonic)
        self.metrics = ServingMetrics(recipe.name)  # GET /metrics: this replica's own registry
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="engine")
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.generation = (GenerationLoop(self.engine, spec, self._pool, self.metrics)
                           if self.engine.generation else None)
        self.vocab = _vocab(recipe)
        self.load_s = time.perf_counter() - start
        self.load_memory = memory_mb()
        self.batches: dict[int, int] = {}  # batch size -> batches run
        self.requests = 0

    # ------------------------------------------------------------------ forward requests
    async def infer(self, inputs: dict) -> InferAnswer:
        """One request's answer and timings; raises collate.BadRequest (400) or QueueFull (503)."""
        if self.engine.generation:
            raise collate.BadRequest(f"recipe `{self.recipe.name}` is a generation engine: "
                                     "POST .../generate with prompt_ids")
        arrays, lengths = collate.check(self.signature, inputs)
        key = collate.bucket(self.signature, lengths)
        future = asyncio.get_running_loop().create_future()
        # [arrays, lengths, future, the engine's error when it fails]
        self.batcher.submit([arrays, lengths, future, None], key)  # QueueFull: nothing was queued
        self._kick()
        return await future

    def _kick(self) -> None:
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop())
        self._wake.set()

    async def _loop(self) -> None:
        """Take each batch as the rules say it is due; sleep until a submit or the delay."""
        while True:
            batch = self.batcher.take()
            if batch is None:
                self._wake.clear()  # no await since take(): no submit can be missed
                try:
                    await asyncio.wait_for(self._wake.wait(), self.batcher.wake_in())
                except TimeoutError:
                    pass
                continue
            await self._run(batch)

    async def _run(self, batch) -> None:
        """Run one batch; when the engine fails it, run each request again alone, so that a
        request the checks let through but the engine refuses fails by itself and its
        batch-mates get the answers they would have got alone."""
        try:
            answers, compute_ms = await self._compute(batch)
        except Exception as e:
            if len(batch) == 1:
                self._fail(batch[0], e, status=500)
                return
            failed = [q for q in batch if not await self._run_alone(q)]
            for q in failed:  # the engine ran the others: the failure is this request's own
                self._fail(q, q.item[3], status=422 if len(failed) < len(batch) else 500)
            return
        self._answer(batch, answers, compute_ms)

    async def _run_alone(self, q) -> bool:
        """A request of a failed batch run again as a batch of one (padded to its own bucket,
        so its answer is what it gets alone); False, with the error kept, when it fails again."""
        try:
            answers, compute_ms = await self._compute([q])
        except Exception as e:
            q.item[3] = e
            return False
        self._answer([q], answers, compute_ms)
        return True

    async def _compute(self, batch) -> tuple[list[dict], float]:
        feed = collate.stack(self.signature, [q.item[0] for q in batch], batch[0].bucket)
        start = time.perf_counter()
        outputs = await asyncio.get_running_loop().run_in_executor(self._pool, self.engine.infer, feed)
        compute_ms = (time.perf_counter() - start) * 1e3
        return collate.split(self.signature, outputs, [q.item[1] for q in batch]), compute_ms

    def _fail(self, q, error: Exception, status: int) -> None:
        self.metrics.tensor_failure(1)
        if not q.item[2].done():
            q.item[2].set_exception(EngineFailed.of(error, status))

    def _answer(self, batch, answers: list[dict], compute_ms: float) -> None:
        self.batches[len(batch)] = self.batches.get(len(batch), 0) + 1
        self.metrics.tensor_batch(len(batch), [q.queue_s() for q in batch], compute_ms / 1e3)
        self.requests += len(batch)
        for q, answer in zip(batch, answers):
            if not q.item[2].done():  # a client that went away cancelled its future
                q.item[2].set_result(InferAnswer(answer, q.queue_s() * 1e3, compute_ms, len(batch)))

    # ------------------------------------------------------------------ generation
    async def generate(self, prompt_ids: list[int], params: SamplingParams):
        """Async iterator: {"token": id} per generated token, then {"done": True, "tokens",
        "finish_reason": "stop" | "length", "prompt_tokens", "queue_ms", "ttft_ms", "tpot_ms",
        "e2e_ms"} (ttft_ms None when no token came, tpot_ms when fewer than two). EOS (unless
        params.ignore_eos) or a stop id ends the sequence ("stop") and is not yielded. Raises
        collate.BadRequest (400) or QueueFull (503) before the first item. Sequences are
        batched continuously (generation_loop.py); a consumer that stops iterating (aclose,
        a client gone) frees its sequence at the loop's next iteration."""
        self._check_generation(prompt_ids, params)
        items = self.generation.generate(prompt_ids, params)
        try:
            first = await anext(items)
        except NeverFits as e:
            raise collate.BadRequest(str(e)) from None
        try:
            yield first
            async for item in items:
                yield item
        finally:
            await items.aclose()
        self.requests += 1

    def _check_generation(self, prompt_ids, params) -> None:
        if not self.engine.generation:
            raise collate.BadRequest(f"recipe `{self.recipe.name}` is not a generation engine: "
                                     "POST .../infer")
        if not isinstance(params, SamplingParams):
            raise collate.BadRequest("generate takes a SamplingParams")
        try:
            check_vocab(params, self.vocab)
        except InvalidSampling as e:
            raise collate.BadRequest(str(e)) from None
        _check_prompt(self.recipe, prompt_ids, params.max_new_tokens)

    # ------------------------------------------------------------------ state
    def stats(self) -> JsonObject:
        node = None
        try:
            import ray

            node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        except ImportError:
            pass
        return {"recipe": self.recipe.name, "engine": self.choice.target, "kind": self.choice.kind,
                "sha256": self.choice.sha256, "pid": os.getpid(), "node_id": node,
                "load_s": self.load_s, "rss_at_load_mb": self.load_memory["rss_mb"],
                **memory_mb(), "queued": len(self.batcher), "requests": self.requests,
                "batches": {str(k): v for k, v in sorted(self.batches.items())},
                "policy": {"max_batch_size": self.policy.max_batch_size,
                           "max_queue_delay_us": self.policy.max_queue_delay_us,
                           "preferred_batch_sizes": list(self.policy.preferred_batch_sizes),
                           "max_queue_size": self.policy.max_queue_size},
                **({"generation": self.generation.stats()} if self.generation else {})}

    def close(self) -> None:
        if self.generation:
            self.generation.close()
        for q in self.batcher.drain():
            if not q.item[2].done():
                q.item[2].set_exception(QueueFull("the replica is shutting down"))
        self._pool.shutdown(wait=True)
        self.engine.close()


def _vocab(recipe) -> int | None:
    """Token ids a request may hold: below the input_ids range's end, when the recipe has one."""
    return int(recipe.inputs[0].range[1]) if recipe.inputs[0].range else None


def _check_prompt(recipe, prompt_ids, max_new_tokens) -> None:
    if not isinstance(prompt_ids, list) or not prompt_ids or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt_ids):
        raise collate.BadRequest("prompt_ids must be a non-empty list of integer token ids")
    vocab = _vocab(recipe)
    if vocab is not None and not all(0 <= t < vocab for t in prompt_ids):
        raise collate.BadRequest(f"prompt_ids must be within [0, {vocab})")
    context = recipe.workload.context_max() + 1
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise collate.BadRequest("max_new_tokens must be an integer >= 1")
    if len(prompt_ids) + max_new_tokens > context:
        raise collate.BadRequest(f"prompt ({len(prompt_ids)}) + max_new_tokens ({max_new_tokens}) "
                                 f"exceeds the engine's context of {context} tokens")
