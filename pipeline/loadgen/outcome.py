"""One request's fate as the client saw it (client.py fills it, summary.py reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Outcome:
    """One request, times in seconds from the point's start (t0)."""

    due: float                 # scheduled send time (closed loop: the send time)
    sent: float = float("nan")
    done: float = float("nan")
    status: str = "error"      # ok | rejected | error | timeout
    queue_ms: float | None = None      # KServe: the server's own figures, when it sends them
    compute_ms: float | None = None
    batch_size: int | None = None
    chunks: list[float] = field(default_factory=list)  # arrival of each streamed text chunk
    completion_tokens: int | None = None  # the OpenAI stream's `usage`, when it sends one
    prompt_tokens: int | None = None
    cached_tokens: int | None = None      # usage.prompt_tokens_details: from the prefix cache
    error: str | None = None
    text: list[str] = field(default_factory=list)  # the reply's text pieces (chat tasks grade them)
    ended: float = float("nan")  # the stream's [DONE]: a reply that ended at once has no chunk

    @property
    def reply(self) -> str:
        return "".join(self.text)

    @property
    def latency(self) -> float:
        """Seconds from due to the last byte; inf unless ok (never below the bound)."""
        return self.done - self.due if self.status == "ok" else float("inf")

    @property
    def tokens(self) -> int:
        """Tokens generated: the server's usage count, else the text chunks that came."""
        return self.completion_tokens if self.completion_tokens is not None else len(self.chunks)
