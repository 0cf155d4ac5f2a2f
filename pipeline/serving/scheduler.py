"""Continuous batching's rules (iteration-level scheduling, as Orca and vLLM do): a pure core,
no engine, no clock, no asyncio, so every rule is tested alone (as batcher.py is for tensors).

A sequence waits, runs in a slot of the engine's KV cache, and finishes. Each iteration:
  1. leave: finished and cancelled sequences leave the running set; their slots and their
     reserved tokens are free again (`Plan.released`).
  2. admit: waiting sequences join in arrival order (FCFS: the oldest first; a head that does
     not fit waits, and no later one passes it, so none starves) while fewer than
     max_running run, its reservation fits the KV budget and the prompt tokens it prefills
     fit this iteration's prefill budget (`Plan.admitted`; the first admission of an
     iteration always fits it). A sequence reserves prompt + max_new_tokens tokens up front,
     so a running one never runs out of cache mid-reply and nothing is ever preempted.
     The prefill budget is what interleaves a burst of arrivals with decode steps: each
     iteration prefills about one prompt and then decodes everything admitted so far, so the
     running sequences' steps are not stalled by the whole burst's prefills, and the burst's
     sequences start decoding (and so finish, and their clients come back) one iteration
     apart instead of together, which would make the next arrivals a burst again.
  3. prefill: each admitted sequence's prompt alone (batch 1), which gives its first token;
     with a prefix cache (prefix_cache.py), only the tokens after its longest cached prefix
     (`Sequence.reuse`), the prefix's keys and values copied into its slot first.
  4. decode: one step for every running sequence that is not finished (`decoding()`).
Steps 3-4 are the caller's (the replica, on its engine thread); `append` applies a token.
A sequence finishes at EOS or a stop id ("stop": that token is not returned), or after
max_new_tokens ("length"); a cancelled one (its client went away) leaves at the next
iteration, or at once while it still waits.
Cached prefixes live in the part of the KV budget the running sequences have not reserved:
finished sequences' tokens are kept there (`keep`), least recently used first out whenever an
admission needs the room (running sequences always come first: a prefix is evicted, never a
request refused for one).
Bounds: a sequence whose prompt + max_new_tokens exceeds the slot width or the whole KV
budget can never run (NeverFits: 400); beyond max_waiting queued sequences (0: unbounded),
plus those the free slots will take at the next iteration, a submit raises QueueFull (503).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from pipeline.generation.sampling import SamplingParams, ends_sequence
from pipeline.serving.batcher import QueueFull
from pipeline.serving.prefix_cache import Match, PrefixCache


class NeverFits(ValueError):
    """A sequence longer than a slot or the whole KV budget: it could never run (HTTP 400)."""


@dataclass(frozen=True)
class Limits:
    max_running: int      # sequences in the running batch (slots of the KV cache)
    kv_tokens: int        # tokens the running sequences may reserve together
    slot_tokens: int      # tokens one slot holds: prompt + max_new_tokens at most
    max_waiting: int = 0  # sequences queued beyond the free slots (0: unbounded)
    prefill_tokens: int = 0  # prompt tokens prefilled per iteration, beyond its first admission (0: unbounded)

    def __post_init__(self):
        if (self.max_running < 1 or self.kv_tokens < 1 or self.slot_tokens < 1 or self.max_waiting < 0
                or self.prefill_tokens < 0):
            raise ValueError(f"invalid scheduler limits {self}")


@dataclass(eq=False)
class Sequence:
    """One request's state; the replica keeps its own timings and channel beside it."""

    prompt: list[int]
    params: SamplingParams
    id: int = 0
    slot: int | None = None
    tokens: list[int] = field(default_factory=list)  # returned to the client, in order
    finish_reason: str | None = None                  # "stop" | "length" | "abort"
    cancelled: bool = False
    reuse: Match | None = None  # its cached prefix, set on admission (dropped once copied)
    reused: int = 0             # prompt tokens taken from a cached prefix: not prefilled

    @property
    def reserved(self) -> int:
        """Tokens of KV cache this sequence may fill: its prompt and every token it may generate."""
        return len(self.prompt) + self.params.max_new_tokens

    @property
    def held(self) -> int:
        """Tokens its slot holds now (the last returned token is fed at the next step)."""
        return len(self.prompt) + max(0, len(self.tokens) - 1)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.cancelled


@dataclass
class Plan:
    released: list[Sequence]   # left the running set: the engine frees their slots
    admitted: list[Sequence]   # joined it, in a slot each: the engine prefills them


class Scheduler:
    def __init__(self, limits: Limits, prefix_cache: PrefixCache | None = None):
        self.limits = limits
        self.prefix_cache = prefix_cache
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []       # in admission order
        self._free_slots = list(range(limits.max_running))  # lowest first
        self._ids = itertools.count(1)

    # ------------------------------------------------------------------ the caller's events
    def submit(self, seq: Sequence) -> Sequence:
        """Queue `seq`; NeverFits when it could never run, QueueFull when the queue is full."""
        if seq.reserved > self.limits.slot_tokens:
            raise NeverFits(f"prompt ({len(seq.prompt)}) + max_new_tokens ({seq.params.max_new_tokens}) "
                             f"exceeds the engine's context of {self.limits.slot_tokens} tokens")
        if seq.reserved > self.limits.kv_tokens:
            raise NeverFits(f"prompt + max_new_tokens ({seq.reserved}) exceeds the KV cache budget "
                             f"of {self.limits.kv_tokens} tokens")
        queued = sum(not s.cancelled for s in self.waiting)
        if self.limits.max_waiting and queued >= self.limits.max_waiting + len(self._free_slots):
            raise QueueFull(f"queue full ({self.limits.max_waiting} requests waiting)")
        seq.id = next(self._ids)
        self.waiting.append(seq)
        return seq

    def cancel(self, seq: Sequence) -> None:
        """The client went away: a waiting sequence leaves now, a running one at the next plan."""
        seq.cancelled = True
        if seq in self.waiting:
            self.waiting.remove(seq)
            seq.finish_reason = seq.finish_reason or "abort"

    def append(self, seq: Sequence, token: int, eos: int | None) -> bool:
        """Applies the token the engine chose for `seq`: True when it is returned to the client;
        sets finish_reason at EOS / a stop id ("stop", not returned) or at max_new_tokens."""
        if ends_sequence(token, seq.params, eos):
            seq.finish_reason = "stop"
            return False
        seq.tokens.append(token)
        if len(seq.tokens) >= seq.params.max_new_tokens:
            seq.finish_reason = "length"
        return True

    def fail(self, seqs: list[Sequence]) -> None:
        """The engine failed on these sequences: they end ("abort") and leave at the next plan."""
        for seq in seqs:
            seq.finish_reason = "abort"

    # ------------------------------------------------------------------ one iteration
    def retire(self) -> list[Sequence]:
        """Step 1: finished and cancelled sequences leave the running set (the engine frees
        their slots). Also between a prefill and the decode step: a sequence can finish at its
        first token, and a decode step must not feed it."""
        released = [s for s in self.running if s.done]
        for seq in released:
            self.running.remove(seq)
            self._free_slots.append(seq.slot)
            if seq.cancelled:
                seq.finish_reason = seq.finish_reason or "abort"
        self._free_slots.sort()
        return released

    def plan(self) -> Plan:
        """Steps 1 and 2 of the module docstring."""
        released = self.retire()
        admitted, spent, budget = [], 0, self.limits.prefill_tokens
        while self.can_admit:
            prefilled = self._prefilled(self.waiting[0])
            if admitted and budget and spent + prefilled > budget:
                break  # the next iteration's first admission: after a decode step
            spent += prefilled
            seq = self.waiting.popleft()
            seq.slot = self._free_slots.pop(0)
            self.running.append(seq)
            admitted.append(seq)
            if self.prefix_cache is not None:
                seq.reuse = self.prefix_cache.match(seq.prompt)
                seq.reused = seq.reuse.length if seq.reuse else 0
                self.prefix_cache.evict_to(self.kv_free)  # the running come first
        return Plan(released, admitted)

    def _prefilled(self, seq: Sequence) -> int:
        """The prompt tokens `seq` would prefill if admitted now (those after its cached prefix)."""
        if self.prefix_cache is None:
            return len(seq.prompt)
        return len(seq.prompt) - self.prefix_cache.longest(seq.prompt)[1]

    def keep(self, tokens: list[int], kv) -> None:
        """A finished sequence's slot held the keys and values `kv` of `tokens`: kept as a
        cached prefix while the budget the running sequences leave has room."""
        if self.prefix_cache is not None and len(tokens) <= self.kv_free:
            self.prefix_cache.insert(tokens, kv)
            self.prefix_cache.evict_to(self.kv_free)

    def decoding(self) -> list[Sequence]:
        """The running sequences a decode step feeds: every one that has not finished."""
        return [s for s in self.running if not s.done]

    # ------------------------------------------------------------------ state
    @property
    def kv_reserved(self) -> int:
        return sum(s.reserved for s in self.running)

    @property
    def kv_free(self) -> int:
        return self.limits.kv_tokens - self.kv_reserved

    @property
    def kv_cached(self) -> int:
        """Tokens the cached prefixes hold (within kv_free)."""
        return self.prefix_cache.tokens if self.prefix_cache is not None else 0

    @property
    def kv_held(self) -> int:
        return sum(s.held for s in self.running)

    @property
    def can_admit(self) -> bool:
        """plan() would admit the head of the queue now (a free slot, its reservation fits)."""
        return bool(self.waiting and self._free_slots and self.waiting[0].reserved <= self.kv_free)

    @property
    def idle(self) -> bool:
        """Nothing runs and nothing waits: the loop may sleep until a submit."""
        return not self.running and not self.waiting
