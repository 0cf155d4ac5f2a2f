"""Slot runners: many sequences of one engine, each in a slot of its KV cache, decoded together.
What a continuous-batching server (serving/scheduler.py, serving/replica.py) drives:

    runner.prefill(slot, tokens [T]) -> logits [V]       a new sequence's prompt into its slot
    runner.decode(slots, tokens [n]) -> logits [n, V]    one token for each running slot, one call
    runner.release(slot)                                 the slot is free again
    runner.held(slot) -> HeldKV                          a copy of what the slot holds
    runner.adopt(slot, held, n)                          a new slot starting with its first n
Logits, never tokens: each request chooses its own (generation/sampling.py).

- BatchedSlots: a GroupQueryAttention graph (the cache in place, genai_config.in_place_cache).
  One preallocated cache per past input, [rows, KV heads, width, head_dim]. GQA reads each
  row's length from the attention mask (seqlens_k = ReduceSum(mask) - 1; the mask's width is
  the total length), so rows at different lengths decode in one call when each row's mask is
  its own length of 1s, right-padded with 0s. The running sequences always fill rows
  0..n-1 (compacted): a decode call binds the view cache[:n] (contiguous, shared with numpy, no
  copy) and computes no padding rows; when a sequence leaves, the last row's used tokens move
  into its row (a copy of used tokens only; 45 KiB a token on SmolLM2). Padding rows were the
  alternative: a free row would still be computed every step (a decode step at batch 16
  instead of 5), and a row with an all-0 mask gives GQA a length of -1. A prefill runs at
  batch 1 on the view cache[row:row+1]: a sequence's prompt never waits for a batch.
- Conversation reuse (serving/prefix_cache.py): `held` copies a finished slot's keys and
  values out (its used tokens only); `adopt` copies the first n of them into a new slot's row,
  whose prefill then appends only the tokens after them (GQA with a past of n: the same call as
  a chat turn's prefill). Copies, not rows kept aside: a running sequence must sit in rows
  0..n-1, and a copy of a few hundred tokens (~10 MB on SmolLM2) costs milliseconds against
  the prefill it saves.
- OneSlot: any turn-keeping DecoderRunner (the PyTorch static cache, an ONNX graph that
  concatenates its cache) as a single slot: one sequence at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.generation.runners import (
    DecoderRunner,
    OrtLoopRunner,
    PastBuffers,
    present_of,
    zeroed_caches,
)

PastArrays = dict[str, np.ndarray]  # past input name -> [KV heads, tokens, head_dim]


@dataclass(frozen=True)
class HeldKV:
    """The keys and values a slot held: its first `length` tokens, copied out of the cache."""

    length: int
    arrays: PastArrays

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


class BatchedSlots:
    """`rows` sequences of up to `width` tokens each in one in-place cache (see the module
    docstring); built over an OrtLoopRunner, whose session and cache layout it shares."""

    def __init__(self, loop: OrtLoopRunner, rows: int, width: int):
        if not loop.in_place:
            raise ValueError("BatchedSlots needs a graph that keeps its cache in place "
                             "(GroupQueryAttention); serve others through OneSlot")
        self.session, self.ort, self.rows, self.width = loop.session, loop.ort, rows, width
        # past name -> [rows, KV, width, hd]; a row's view is bound for a prefill or decode
        self.caches = zeroed_caches(loop.past_names, (rows, loop.kv_heads, width, loop.head_dim), loop.cache_dtype)
        self.slot_at: list[int] = []          # row -> slot: rows 0..n-1 are the running slots
        self.length: dict[int, int] = {}      # slot -> tokens its row holds
        self._view_cache: dict[tuple[int, int], dict] = {}  # (first row, end row) -> OrtValues
        self._bindings: dict[tuple[int, int], object] = {}  # (first row, end row) -> IOBinding

    @property
    def bytes_per_token(self) -> int:
        """One token of one sequence across every layer's key and value (in the cache's type)."""
        return sum(c.shape[1] * c.shape[3] * c.itemsize for c in self.caches.values())

    def _views(self, start: int, stop: int) -> PastBuffers:
        """OrtValues over rows [start, stop) of every cache (views: ORT writes into numpy's
        memory), made once per row range: 2 x layers of them a call (60 on SmolLM2) cost
        ~0.3 ms a decode step to make afresh."""
        key = (start, stop)
        if key not in self._view_cache:
            self._view_cache[key] = {n: self.ort.OrtValue.ortvalue_from_numpy(c[start:stop])
                                     for n, c in self.caches.items()}
        return self._view_cache[key]

    def _run(self, start: int, stop: int, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """One call on rows [start, stop): ids [n, T], mask [n, total] -> logits [n, T, V] (ORT's
        buffer: copy what is kept). Runs run_cached's binding, kept per row range with every
        past and its present bound to the rows' views once (120 binds on SmolLM2, ~0.2 ms
        a step to redo); each call binds only the ids, the mask and a fresh logits output."""
        key = (start, stop)
        binding = self._bindings.get(key)
        if binding is None:
            binding = self._bindings[key] = self.session.io_binding()
            binding.bind_output("logits")  # first: get_outputs()[0]
            for name, value in self._views(start, stop).items():
                binding.bind_ortvalue_input(name, value)
                binding.bind_ortvalue_output(present_of(name), value)
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(ids, dtype=np.int64))
        binding.bind_cpu_input("attention_mask", np.ascontiguousarray(mask, dtype=np.int64))
        binding.bind_output("logits")  # else the last call's logits buffer, of its shape, is reused
        self.session.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy()

    def _take_row(self, slot: int) -> int:
        """A new slot takes the next free row (empty); returns the row."""
        if len(self.slot_at) == self.rows:
            raise ValueError(f"all {self.rows} rows are running")
        self.slot_at.append(slot)
        self.length[slot] = 0
        return len(self.slot_at) - 1

    def held(self, slot: int) -> HeldKV:
        """A copy of the keys and values `slot`'s row holds (its used tokens)."""
        row, used = self.slot_at.index(slot), self.length[slot]
        return HeldKV(used, {n: c[row, :, :used].copy() for n, c in self.caches.items()})

    def adopt(self, slot: int, held: HeldKV, tokens: int) -> None:
        """A new `slot` starts holding the first `tokens` of `held` (a prefix whose ids
        its prompt starts with); its prefill then appends the rest."""
        if slot in self.length:
            raise ValueError(f"slot {slot} is running: only a new slot adopts a prefix")
        if not 0 < tokens <= min(held.length, self.width):
            raise ValueError(f"cannot adopt {tokens} tokens of a prefix of {held.length}")
        row = self._take_row(slot)
        for name, cache in self.caches.items():
            cache[row, :, :tokens] = held.arrays[name][:, :tokens]
        self.length[slot] = tokens

    def prefill(self, slot: int, tokens: np.ndarray) -> np.ndarray:
        """Appends tokens [T] to `slot` (a new slot takes the next free row) at batch 1;
        returns the last position's logits [V]."""
        if slot not in self.length:
            self._take_row(slot)
        row, total = self.slot_at.index(slot), self.length[slot] + len(tokens)
        if total > self.width:
            raise ValueError(f"slot {slot}: {total} tokens exceed the row's {self.width}")
        mask = np.ones((1, total), np.int64)
        logits = self._run(row, row + 1, np.asarray(tokens)[None], mask)
        self.length[slot] = total
        return logits[0, -1].copy()  # [V]: the binding's buffer is not ours to keep

    def decode(self, slots: list[int], tokens: np.ndarray) -> np.ndarray:
        """One token per running slot (tokens [n], in `slots`' order; every running slot, since
        each row of the call appends a token) -> logits [n, V] in the same order."""
        if sorted(slots) != sorted(self.slot_at):
            raise ValueError(f"decode must cover every running slot {sorted(self.slot_at)}, got {sorted(slots)}")
        n = len(self.slot_at)
        row_of = {slot: row for row, slot in enumerate(self.slot_at)}
        ids = np.empty((n, 1), np.int64)
        lengths = np.empty(n, np.int64)
        for slot, token in zip(slots, tokens):
            ids[row_of[slot], 0] = token
            lengths[row_of[slot]] = self.length[slot] + 1
        if lengths.max() > self.width:
            raise ValueError(f"a row would hold {lengths.max()} tokens, past its {self.width}")
        # [n, longest]: row r is 1 for its own lengths[r] tokens, then 0 (GQA's seqlens_k per row)
        mask = (np.arange(lengths.max())[None, :] < lengths[:, None]).astype(np.int64)
        logits = self._run(0, n, ids, mask)[:, -1]  # [n, V] in row order
        for slot in slots:
            self.length[slot] += 1
        return logits[[row_of[s] for s in slots]]  # fancy indexing copies

    def release(self, slot: int) -> None:
        """Frees `slot`'s row: the last row's sequence moves into it (its used tokens only).
        A slot whose prefill failed before it took a row has none to free."""
        if slot not in self.length:
            return
        row, last = self.slot_at.index(slot), len(self.slot_at) - 1
        if row != last:
            moved = self.slot_at[last]
            used = self.length[moved]
            for cache in self.caches.values():
                cache[row, :, :used] = cache[last, :, :used]
            self.slot_at[row] = moved
        self.slot_at.pop()
        del self.length[slot]

    def close(self) -> None:
        self.session = None
        self.caches, self._view_cache, self._bindings = {}, {}, {}


class OneSlot:
    """A turn-keeping DecoderRunner (OrtLoopRunner, TorchStaticRunner: they expose `logits` and
    take `last`) as one slot: one sequence at a time (prefill starts it
    afresh), for engines whose cache cannot hold rows at different lengths."""

    rows = 1
    bytes_per_token = None  # the runner keeps its own cache, of its own layout

    def __init__(self, runner: DecoderRunner, width: int):
        self.runner, self.width = runner, width
        self.slot: int | None = None

    def prefill(self, slot: int, tokens: np.ndarray) -> np.ndarray:
        if self.slot is None:
            self.runner.new(1)
            self.slot = slot
        elif slot != self.slot:
            raise ValueError(f"one sequence at a time: slot {self.slot} is running")
        self.runner.prefill(np.asarray(tokens, np.int64)[None])
        return self.runner.logits[0]

    def decode(self, slots: list[int], tokens: np.ndarray) -> np.ndarray:
        if list(slots) != [self.slot]:
            raise ValueError(f"decode must cover the running slot {self.slot}, got {slots}")
        self.runner.last = np.asarray(tokens, np.int64)[:1]  # the token step() feeds
        self.runner.step()
        return self.runner.logits[:1]

    def release(self, slot: int) -> None:
        if slot == self.slot:
            self.slot = None

    def close(self) -> None:
        self.runner.close()
