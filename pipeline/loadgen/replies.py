"""Reading a server's answers: a KServe v2 response, or an OpenAI server-sent event stream.

What a server sends is not trusted: every figure the load result keeps from it (KServe's
queue_ms / compute_ms / batch_size parameters, the stream's usage token counts) must be a
finite number in its range, and JSON's NaN / Infinity, which Python's json reads by default,
are refused. A reply that breaks this is a failed request with the reason (BadReply), never
a figure stored as sent.
"""

from __future__ import annotations

import json
import math
import time

from pipeline.loadgen.outcome import Outcome
from pipeline.loadgen.protocol import HEADER_LENGTH

MAX_MS = 1e9          # ~11 days: no single request's queue or compute time is longer
MAX_COUNT = 10**9     # tokens or samples in one request


class BadReply(Exception):
    """The server answered 200 with something this client cannot count: the request fails."""


def _constant(name: str):
    raise BadReply(f"the server sent {name}, which is not a number")


def strict_json(data: bytes | str):
    """JSON with NaN / Infinity / -Infinity refused (Python's json accepts them)."""
    try:
        return json.loads(data, parse_constant=_constant)
    except ValueError as e:
        raise BadReply(f"the answer is not JSON ({e})") from None


def figure_ms(name: str, value) -> float | None:
    """A duration the server reports, in ms: None when absent, BadReply when not in [0, MAX_MS]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not \
            (math.isfinite(value) and 0 <= value <= MAX_MS):
        raise BadReply(f"the server sent {name}={value!r}: not a duration in ms (0 to {MAX_MS:g})")
    return float(value)


def figure_count(name: str, value, least: int = 0) -> int | None:
    """A count the server reports: None when absent, BadReply unless an integer in range."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_COUNT:
        raise BadReply(f"the server sent {name}={value!r}: not a count ({least} to {MAX_COUNT:g})")
    return value


def read_kserve(body: bytes, header_length: str | None, out: Outcome) -> None:
    """A KServe v2 response: its JSON header must hold `outputs`, binary outputs must add up
    to the bytes that came; the server's timings (this project's server sends them in
    `parameters`) are kept when valid."""
    size = len(body)
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise BadReply(f"{HEADER_LENGTH} {header_length!r} does not fit the {len(body)} bytes")
        size = int(header_length)
    answer = strict_json(body[:size])
    outputs = answer.get("outputs") if isinstance(answer, dict) else None
    if not isinstance(outputs, list) or not outputs:
        raise BadReply("the answer has no `outputs`")
    binary = 0
    for entry in outputs:
        sized = ((entry.get("parameters") or {}) if isinstance(entry, dict) else {}).get("binary_data_size")
        binary += figure_count("binary_data_size", sized) or 0
    if binary != len(body) - size:
        raise BadReply(f"the outputs declare {binary} bytes of binary data; {len(body) - size} came")
    parameters = answer.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadReply("the answer's `parameters` is not an object")
    out.queue_ms = figure_ms("queue_ms", parameters.get("queue_ms"))
    out.compute_ms = figure_ms("compute_ms", parameters.get("compute_ms"))
    out.batch_size = figure_count("batch_size", parameters.get("batch_size"), least=1)


async def read_stream(lines, chat: bool, out: Outcome, t0: float, empty_ok: bool = False) -> None:
    """An OpenAI stream (`data: {chunk}` events, then `data: [DONE]`): the arrival time and
    text of each chunk that carries text, the usage's token counts, when [DONE] came. An
    error event fails the request; so does a stream that ends before [DONE], or without any
    text (no first token to time, as vLLM's benchmark counts it) unless `empty_ok`: a turn of
    a chat task whose model ended its reply at once is an answer (an empty one)."""
    async for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # blank separators, `: comments`, `event:` lines
        data = line[5:].strip()
        now = time.perf_counter() - t0
        if data == b"[DONE]":
            out.ended = now
            break
        chunk = strict_json(data)
        if not isinstance(chunk, dict):
            raise BadReply("a stream event is not a JSON object")
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise BadReply(f"the stream ended in an error: {str(message)[:160]}")
        piece = _text(chunk, chat)
        if piece:
            out.chunks.append(now)
            out.text.append(piece)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            out.completion_tokens = figure_count("completion_tokens", usage.get("completion_tokens"))
            out.prompt_tokens = figure_count("prompt_tokens", usage.get("prompt_tokens"))
            details = usage.get("prompt_tokens_details")  # OpenAI's and vLLM's, when sent
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                out.cached_tokens = figure_count("cached_tokens", details["cached_tokens"])
    else:
        raise BadReply("the stream ended before `data: [DONE]`")
    if not out.chunks and not empty_ok:
        said = "" if out.completion_tokens is None else \
            f"; usage: {out.completion_tokens} completion tokens, the model ended at once"
        raise BadReply(f"the stream carried no text (no first token to time{said})")
    if out.chunks and out.completion_tokens is not None and out.completion_tokens < 1:
        raise BadReply(f"text came, yet the usage counts {out.completion_tokens} completion tokens")


def _text(chunk: dict, chat: bool) -> str:
    """The text the chunk's first choice carries ("" for none: a chat's role-only chunk)."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    if chat:
        delta = choice.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else None
    else:
        piece = choice.get("text")
    return piece if isinstance(piece, str) else ""
