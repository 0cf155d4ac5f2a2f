"""Generated token ids -> the reply's text, handed out as it becomes stable, cut before a stop
string: what serving/openai_api.py streams (its `stop`) and `pipeline generate` prints.

    stream = TextStream(tokenizer, stop=("\\n\\n",))
    for token in tokens:
        delta = stream.add(token)        # text that will not change any more ("" while unsure)
        if stream.stopped:               # a stop string appeared: stop generating
            break
    rest = stream.finish()               # whatever was held back
    stream.text                          # the reply: tokenizer.decode(ids), cut before the stop

Text is decoded in a window of tokens (vLLM's and TGI's incremental detokenization): the
tokens since the last text handed out, after the tokens before them as context, so that a
token whose text depends on its neighbours (a byte-level BPE piece holding half of a UTF-8
character, a WordPiece `##` continuation, a SentencePiece word's leading space) is decoded
with them, at a cost that does not grow with the reply. Text ending in U+FFFD (a character
whose remaining bytes are still to come) is held back, and so is a tail that could be the
start of a stop string. `finish` decodes all ids at once and hands out what is left, so the
whole text is `tokenizer.decode(ids)` (cut before the first stop string) whenever the
tokenizer's decode is prefix-stable (bytes, byte-level BPE, SentencePiece): one whose
clean-up rewrites text already handed out ("do n't" -> "don't", BERT's) cannot be streamed
exactly, and its streamed deltas keep what was sent.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.data.tokenizer import Tokenizer

INCOMPLETE = "\ufffd"  # what decode gives for a UTF-8 sequence whose last bytes are missing


class TextStream:
    """One reply's ids and text; `add` each generated id, then `finish` once."""

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()):
        if any(not s for s in stop):
            raise ValueError("a stop string must not be empty")
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.ids: list[int] = []
        self.text = ""         # the reply's text so far (what was handed out + what is held)
        self.stopped = False   # a stop string appeared; self.text is cut before it
        self._sent = 0         # characters of self.text handed out
        self._window = 0       # ids[_window:_decoded] are the context of the next decode
        self._decoded = 0      # ids whose text is in self.text

    def add(self, token: int) -> str:
        """The new stable text after one more generated id ("" while it may still change)."""
        if self.stopped:
            raise RuntimeError("the reply already ended at a stop string")
        self.ids.append(int(token))
        context = self.tokenizer.decode(self.ids[self._window:self._decoded])
        text = self.tokenizer.decode(self.ids[self._window:])
        if len(text) <= len(context) or text.endswith(INCOMPLETE):
            return ""  # nothing new yet, or a character cut in the middle
        searched = len(self.text)
        self.text += text[len(context):]
        self._window, self._decoded = self._decoded, len(self.ids)
        return self._release(searched)

    def finish(self) -> str:
        """The text still held back once generation ended; self.text is then the whole reply."""
        if self.stopped:
            return ""
        whole = self.tokenizer.decode(self.ids)
        if not whole.startswith(self.text[:self._sent]):
            # a decode that rewrote text already sent (see the module's docstring): the stream
            # cannot take it back, so the reply stays what was sent plus nothing new
            self.text = self.text[:self._sent]
            return ""
        searched = self._sent
        self.text = whole
        return self._release(searched, final=True)

    def _release(self, searched: int, final: bool = False) -> str:
        """Hand out self.text up to what is stable, cut before the stop string that appeared
        first: the one that ends first (then the one that starts first), as if the text had
        come one character at a time, so the cut does not depend on how the tokens split it.
        Only stops ending after `searched` are new (one may straddle that point)."""
        longest = max((len(s) for s in self.stop), default=0)
        start = max(0, searched - longest + 1)
        hits = [(i + len(s), i) for s in self.stop if (i := self.text.find(s, start)) >= 0]
        if hits:
            self.text, self.stopped = self.text[:min(hits)[1]], True
        end = len(self.text) if final or self.stopped else len(self.text) - self._maybe_stop()
        out, self._sent = self.text[self._sent:end], max(self._sent, end)
        return out

    def _maybe_stop(self) -> int:
        """Characters at the end of the text that a stop string could begin with."""
        for k in range(min(len(self.text), max((len(s) for s in self.stop), default=1) - 1), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self.stop):
                return k
        return 0
