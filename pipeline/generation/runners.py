"""Generation runners: one decoder each, driven token by token by the workload.

Every runner has the same three calls, so the workload times them alike:
    new(batch)        a fresh, empty context for `batch` sequences (untimed)
    prefill(tokens)   append tokens [B, T] to the context; returns the next tokens [B]
    step()            feed the tokens returned last; returns the next tokens [B]
Greedy decoding with the end-of-sequence token suppressed, so every runner generates exactly
the tokens asked for. A turn after the first appends the previous reply's last token with
its prompt (that token was chosen but never fed).

- GenaiRunner: onnxruntime-genai's C++ generation loop over the engine (genai_config.json
  written by the pipeline). Single-turn points only: genai 0.18 counts the reply's last token
  (chosen, never fed) in the attention mask of an append_tokens after generate_next_token but
  never computes its K/V. On a concatenating cache the run fails (measured: "present.0.key ...
  {1,2,29,16} but the computed output shape ... {1,2,28,16}"; with ONNX Attention:
  "inconsistent total_sequence_length (between attn_mask and past_key ...)"); on a shared
  buffer it runs and attends to an empty slot (measured on SmolLM2 INT4: the second turn's
  tokens differ from the loop's from the first one on). tests/generation/test_run.py pins the
  failure.
- OrtLoopRunner: a lean ONNX Runtime loop with IOBinding; runs the task's turns, which genai
  cannot. On a GroupQueryAttention graph (genai_config.in_place_cache) the presents are bound
  to the pasts' own preallocated buffers and the kernel appends in place; otherwise the
  presents stay OrtValues bound as the next pasts (no copy out of ONNX Runtime, but the graph
  concatenates the whole cache each step).
- TorchStaticRunner: the PyTorch baseline over a static (preallocated) KV cache.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.generation.genai_config import in_place_cache, present_of
from pipeline.precision.kv_cache import cache_dtype

PastBuffers = dict[str, Any]  # past input name -> its OrtValue cache buffer

# Tokens an in-place cache holds at first, and the room it keeps past a prompt that outgrows
# it (a 5,120-token prompt then decodes without a second copy); it at least doubles each time.
FIRST_CAPACITY = 256


def _greedy(logits: np.ndarray, eos: int | None) -> np.ndarray:
    """logits [B, vocab] -> next tokens [B], EOS never chosen (eos None: answers, which stop
    at it)."""
    if eos is None:
        return logits.argmax(axis=-1).astype(np.int64)
    logits = logits.copy()
    logits[:, eos] = -np.inf
    return logits.argmax(axis=-1).astype(np.int64)


def ort_session(engine: Path, threads: int | None, spin: bool = False):
    """A CPU session. Its workers do not spin by default (while the baseline takes its turn,
    or while a server's engine thread waits for requests: docs/measurement.md). spin=True: they
    spin-wait between the parallel sections of a run and stop when the run returns
    (`session.force_spinning_stop`), so nothing spins between runs."""
    import onnxruntime as ort

    return ort.InferenceSession(str(engine), session_options(threads, spin), providers=["CPUExecutionProvider"])


def session_options(threads: int | None, spin: bool = False):
    """ort_session's options (a benchmark adds the profiler to them)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if spin:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


def zeroed_caches(past_names: list[str], shape: tuple[int, int, int, int],
                  dtype: np.dtype = np.float32) -> dict[str, np.ndarray]:
    """One zeroed cache per past input in the graph's cache type (precision.kv_cache), each of
    `shape` [B, KV heads, tokens, head_dim] (np.zeros: pages never written cost no resident
    memory)."""
    return {n: np.zeros(shape, dtype) for n in past_names}


def run_cached(session, tokens: np.ndarray, mask: np.ndarray, past: PastBuffers, in_place: bool) -> list:
    """One call of a KV-cache graph through IOBinding: tokens [B, T], attention_mask [B, total]
    (each row's own length of 1s, then 0s), the pasts as OrtValues. In place (GroupQueryAttention),
    each present is bound to its past's own buffer and the kernel appends the new K/V there;
    otherwise the presents are new OrtValues. Returns [logits [B, T, V], presents...]."""
    binding = session.io_binding()
    binding.bind_cpu_input("input_ids", np.ascontiguousarray(tokens, dtype=np.int64))
    binding.bind_cpu_input("attention_mask", np.ascontiguousarray(mask, dtype=np.int64))
    for name, value in past.items():
        binding.bind_ortvalue_input(name, value)
    binding.bind_output("logits")
    for name, value in past.items():
        if in_place:
            binding.bind_ortvalue_output(present_of(name), value)
        else:
            binding.bind_output(present_of(name))
    session.run_with_iobinding(binding)
    return binding.get_outputs()


class DecoderRunner(abc.ABC):
    """The contract of a generation runner (the module docstring says what each call does).
    As with the engine backends' Polygraphy-style runners, a runner is a context manager that
    closes itself; `name` labels its figures, `turns` says whether it can append a turn after
    generating. The workload, serving and the benchmarks drive any runner through these."""

    name: str
    turns: bool

    @abc.abstractmethod
    def new(self, batch: int) -> None: ...

    @abc.abstractmethod
    def prefill(self, tokens: np.ndarray) -> np.ndarray: ...

    @abc.abstractmethod
    def step(self) -> np.ndarray: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> DecoderRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class GenaiRunner(DecoderRunner):
    name = "onnxruntime-genai"
    turns = False  # cannot append a turn after generating (see the module docstring)

    def __init__(self, folder: Path, context_length: int):
        import onnxruntime_genai as og

        self.og, self.context = og, context_length
        self.model = og.Model(str(folder))
        self.generator = None

    def new(self, batch: int) -> None:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=self.context, min_length=self.context,
                                  do_sample=False, batch_size=batch)
        self.generator = self.og.Generator(self.model, params)

    def prefill(self, tokens: np.ndarray) -> np.ndarray:
        self.generator.append_tokens(np.ascontiguousarray(tokens, dtype=np.int32))
        self.generator.generate_next_token()  # logits were computed by append_tokens: selects only
        return np.asarray(self.generator.get_next_tokens(), dtype=np.int64)

    def step(self) -> np.ndarray:
        self.generator.generate_next_token()  # runs the model on the last token, then selects
        return np.asarray(self.generator.get_next_tokens(), dtype=np.int64)

    def close(self) -> None:
        self.generator = None
        self.model = None


class _Turns(DecoderRunner):
    """prefill/step over one `_run(tokens [B, T]) -> next tokens [B]` that sets self.last and
    self.logits (the last position's [B, V], for a caller that chooses the token itself and
    then sets self.last): the runners that keep their own context across turns (OrtLoopRunner,
    TorchStaticRunner)."""

    turns = True
    last: np.ndarray | None = None
    logits: np.ndarray | None = None

    @abc.abstractmethod
    def _run(self, tokens: np.ndarray) -> np.ndarray: ...

    def prefill(self, tokens: np.ndarray) -> np.ndarray:
        if self.last is not None:  # a later turn: the reply's last token goes in first
            tokens = np.concatenate([self.last[:, None], tokens], axis=1)
        return self._run(tokens)

    def step(self) -> np.ndarray:
        return self._run(self.last[:, None])


class OrtLoopRunner(_Turns):
    name = "onnxruntime-iobinding"
    turns = True

    def __init__(self, engine: Path, eos: int, threads: int | None = None, in_place: bool | None = None,
                 spin: bool = False):
        """spin: ort_session's. in_place: whether the graph keeps its cache in place (genai_config.in_place_cache),
        when the caller knows it already: finding out parses the whole ONNX file (~4 s for
        SmolLM2's 540 MB FP32 graph), on top of the session's own load."""
        import onnxruntime as ort

        self.ort, self.eos = ort, eos
        self.session = ort_session(engine, threads, spin)
        inputs = self.session.get_inputs()
        self.past_names = [i.name for i in inputs[2:]]
        _, self.kv_heads, _, self.head_dim = inputs[2].shape
        self.cache_dtype = cache_dtype(self.session)  # float32, or precision.kv_cache's type
        # then each present comes back into its past's buffer
        self.in_place = in_place_cache(engine) if in_place is None else in_place

    def new(self, batch: int) -> None:
        self.length, self.batch, self.last = 0, batch, None
        self.capacity = FIRST_CAPACITY if self.in_place else 0
        self.past = self._buffers(self.capacity)

    def _buffers(self, tokens: int) -> PastBuffers:
        """One zeroed [B, KV, tokens, hd] cache per past input."""
        caches = zeroed_caches(self.past_names, (self.batch, self.kv_heads, tokens, self.head_dim), self.cache_dtype)
        return {n: self.ort.OrtValue.ortvalue_from_numpy(c) for n, c in caches.items()}

    def _grow(self, needed: int) -> None:
        """A larger in-place cache holding what the old one held: room for `needed` tokens and
        FIRST_CAPACITY more, at least twice the old (amortized: one copy per doubling)."""
        held = self.capacity
        self.capacity = max(needed + FIRST_CAPACITY, 2 * held)
        grown = self._buffers(self.capacity)
        for name, value in self.past.items():
            grown[name].numpy()[:, :, :held] = value.numpy()  # numpy() of a CPU OrtValue is a view
        self.past = grown

    def _run(self, tokens: np.ndarray) -> np.ndarray:
        self.length += tokens.shape[1]
        if self.in_place and self.length > self.capacity:
            self._grow(self.length)
        mask = np.ones((self.batch, self.length), np.int64)
        outputs = run_cached(self.session, tokens, mask, self.past, self.in_place)
        if not self.in_place:  # presents (bound in the pasts' order) become the next pasts
            self.past = dict(zip(self.past_names, outputs[1:]))
        self.logits = outputs[0].numpy()[:, -1].copy()  # [B, V]: the binding's buffer is reused
        self.last = _greedy(self.logits, self.eos)
        return self.last

    def close(self) -> None:
        self.session = None


class TorchStaticRunner(_Turns):
    name = "torch-static-cache"
    turns = True

    def __init__(self, decoder, eos: int, threads: int | None = None):
        """decoder: a static-cache decoder (reset(batch); __call__(ids) -> next logits [B, V])."""
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.torch, self.decoder, self.eos = torch, decoder, eos

    def new(self, batch: int) -> None:
        self.decoder.reset(batch)
        self.last = None

    def _run(self, tokens: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            logits = self.decoder(self.torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64)))
        self.logits = logits.numpy()
        self.last = _greedy(self.logits, self.eos)
        return self.last

    def close(self) -> None:
        self.decoder = None


def torch_decoder(recipe, model, max_len: int):
    """The static-cache decoder of the recipe's PyTorch model."""
    if recipe.model.zoo == "glm":
        from pipeline.generation.glm_cache import StaticCacheGLM

        return StaticCacheGLM(model, max_len)
    from pipeline.generation.llama_cache import StaticCacheLlama

    return StaticCacheLlama(model.model, max_len)
