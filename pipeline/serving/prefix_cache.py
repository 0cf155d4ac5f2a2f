"""Conversation reuse: the KV cache of finished sequences kept, keyed by their token ids, so a
request whose prompt starts with one prefills only the tokens after it (vLLM's automatic prefix
caching, SGLang's radix cache, llama.cpp's slot cache do the same). Pure: no engine, no clock;
what an entry holds (`kv`) is the engine's copy of its rows, opaque here.

- Longest-prefix match by a scan of the entries, each compared with the prompt token by token
  (numpy): the match may end anywhere, not only at a block edge, so a prompt sharing a system
  prompt and part of a question with an entry reuses all of it. The entries are bounded by the
  KV budget (a few dozen conversations), so the scan costs well under a millisecond; a radix
  tree would share the common parts' memory too, at the price of pages and reference counts.
- A match leaves at least the prompt's last token to prefill: its logits give the first token.
- An entry that is a prefix of a newer one is dropped when that one comes (turn 2's entry
  holds turn 1's tokens and more); a newer one that is a prefix of an entry only touches it.
- Eviction: least recently used first, whenever the budget's owner (scheduler.py) needs the
  tokens: running sequences always come before cached prefixes.
- Counted as vLLM counts them: queries and hits in prompt tokens.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(eq=False)
class CachedPrefix:
    tokens: np.ndarray       # int64 [length]: the ids whose keys and values `kv` holds
    kv: Any                  # the engine's copy of them (generation/slots.py's HeldKV)
    last_used: int = 0

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Match:
    entry: CachedPrefix
    length: int              # the prompt's first `length` tokens are the entry's: not prefilled


@dataclass
class PrefixCache:
    entries: list[CachedPrefix] = field(default_factory=list)
    queried_tokens: int = 0  # prompt tokens looked up (vLLM's prefix_cache_queries)
    hit_tokens: int = 0      # of them, found cached (vLLM's prefix_cache_hits)
    evicted: int = 0         # entries evicted for room
    _clock: itertools.count = field(default_factory=itertools.count, repr=False)

    @property
    def tokens(self) -> int:
        """Tokens the entries hold together (what they take of the KV budget)."""
        return sum(e.length for e in self.entries)

    def match(self, prompt: list[int]) -> Match | None:
        """The entry sharing the longest prefix with `prompt` (at most all but its last
        token), touched; None when no entry shares a token. Counts the query and the hit."""
        best, best_length = self.longest(prompt)
        self.queried_tokens += len(prompt)
        if best is None:
            return None
        best.last_used = next(self._clock)
        self.hit_tokens += best_length
        return Match(best, best_length)

    def longest(self, prompt: list[int]) -> tuple[CachedPrefix | None, int]:
        """(the entry sharing the longest prefix with `prompt`, at most all but its last token,
        and that length); (None, 0) when none shares a token. Neither touches nor counts."""
        ids = np.asarray(prompt, np.int64)
        best, best_length = None, 0
        for entry in self.entries:
            length = _common_prefix(entry.tokens, ids[:-1])
            if length > best_length:
                best, best_length = entry, length
        return best, best_length

    def insert(self, tokens: list[int], kv: Any) -> None:
        """Keeps `kv`, the keys and values of `tokens`, as the most recently used entry."""
        ids = np.asarray(tokens, np.int64)
        if not len(ids):
            return
        for entry in self.entries:
            if _common_prefix(entry.tokens, ids) == len(ids):  # already held, whole
                entry.last_used = next(self._clock)
                return
        self.entries = [e for e in self.entries if _common_prefix(e.tokens, ids) < e.length]
        self.entries.append(CachedPrefix(ids, kv, next(self._clock)))

    def evict_to(self, tokens: int) -> None:
        """Drops the least recently used entries until the rest hold at most `tokens`."""
        self.entries.sort(key=lambda e: e.last_used)
        while self.entries and self.tokens > tokens:
            self.entries.pop(0)
            self.evicted += 1


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
