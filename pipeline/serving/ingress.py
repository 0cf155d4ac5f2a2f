"""The HTTP ingress in front of the engine replicas: a process of its own that outlives them,
so a replica that dies (SIGKILL, the OOM killer, a crash in a native library) is answered
in the API's own shapes instead of a cut connection or a text/plain 500:

  - a live stream whose replica died ends with an error line: an OpenAI-shaped error event
    then `data: [DONE]` on text/event-stream, an {"error"} line on NDJSON (/generate);
  - a request whose replica died before it answered (queued there, or new) gets 503 in the
    route's error shape with Retry-After, while Serve restarts the replica.

As Ray Serve's own LLM stack does (an OpenAI ingress deployment in front of the LLM server
deployments), the routes stay where the engine is: the replica runs http_api's FastAPI app
in process (`ReplicaHttp`), and the ingress forwards each request to it whole (the body read
and bounded by guard.RequestGuard first) through a streaming DeploymentHandle call, whose
items are the answer's start and its body pieces. Every body piece that is ready when the
replica's generator resumes goes in one item; with `window_s` > 0 the replica waits that
long after a piece for more before sending it (fewer Ray items per token, later tokens).
benchmarks/results/ingress-hop-2026-12-05.md measured what the hop costs per token.

    Ingress(call, limit)         the ASGI app (`call(Forwarded)`: an async iterator of items)
    ReplicaHttp(app, window_s)   the replica side: `answer(request)` yields the items
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from pipeline.serving import errors, guard

log = logging.getLogger(__name__)

# One item of an answer: (the response start {"status", "headers"} or None, body bytes, more)
Item = tuple[dict | None, bytes, bool]
SCOPE_KEYS = ("type", "http_version", "method", "scheme", "path", "raw_path", "query_string",
              "root_path", "headers", "client", "server")


RECEIVING = "pipeline.receiving"  # the scope key: bodies the ingress is reading now (/stats)


@dataclass(frozen=True)
class Forwarded:
    """What crosses to the replica: the HTTP scope's plain fields (with how many other bodies
    the ingress is still reading: they wait here, not in the replica), the whole body, and the
    prompt text the request router reads (routing.py; None unless serve.routing is prefix)."""

    scope: dict
    body: bytes
    prompt: str | None = None


def request_of(scope: dict, body: bytes, receiving: int = 0, with_prompt: bool = False) -> Forwarded:
    prompt = prompt_text(scope.get("path", ""), body) if with_prompt else None
    return Forwarded({**{k: scope[k] for k in SCOPE_KEYS if k in scope}, RECEIVING: receiving},
                     body, prompt)


def prompt_text(path: str, body: bytes) -> str | None:
    """An OpenAI request's prompt as text for prefix routing: a chat's message contents in
    order (text parts of a content list too), a completion's prompt string or its token ids
    written out; None for anything else or a body that does not parse (the replica answers
    that one with its 400)."""
    if not path.endswith("/completions"):
        return None
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(request, dict):
        return None
    if isinstance(request.get("messages"), list):
        return "".join(_text(m.get("content")) for m in request["messages"] if isinstance(m, dict))
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
        return "".join(f"{i}," for i in prompt)  # token ids as text: a prefix stays a prefix
    return prompt if isinstance(prompt, str) else None


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: [{"type": "text", "text": ...}]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict)
                       and isinstance(p.get("text"), str))
    return ""


def unavailable(error: BaseException) -> bool:
    """The replica died or cannot be reached (not a fault of this request): 503, retry."""
    from ray import exceptions as ray_errors
    from ray.serve import exceptions as serve_errors

    kinds = (ray_errors.RayActorError, ray_errors.ActorUnavailableError,
             serve_errors.BackPressureError, serve_errors.DeploymentUnavailableError)
    return isinstance(error, kinds)


def cut_short_ending(content_type: str, path: str, message: str) -> bytes:
    """The last bytes of a stream whose replica stopped after the answer began: an error
    event then [DONE] (server-sent events: OpenAI's clients raise on it), an {"error"} line
    (NDJSON); nothing for a plain body (it ends short of its Content-Length: the client's
    HTTP library reports it)."""
    from pipeline.serving.openai_protocol import DONE, event

    if content_type.startswith("text/event-stream"):
        return (event(errors.body(path, 503, message)) + DONE).encode()
    if content_type.startswith("application/x-ndjson"):
        return (json.dumps({"error": message}) + "\n").encode()
    return b""


class Ingress:
    """The ASGI app of the ingress deployment. `call(request)` -> the replica's items;
    `limit()` the body limit (guard.body_limit of the replica); `api_key` as http_api's."""

    def __init__(self, call: Callable[[Forwarded], AsyncIterator[Item]], limit: Callable[[], int],
                 api_key: str | None = None, with_prompt: bool = False):
        self.call, self.with_prompt = call, with_prompt
        self.receiving = guard.Receiving()
        self.app = guard.RequestGuard(self._forward, api_key, limit, self.receiving)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":  # Serve runs the app's lifespan once: nothing to set up
            return await _lifespan(receive, send)
        if scope["type"] != "http":
            return None
        return await self.app(scope, receive, send)

    async def _forward(self, scope, receive, send) -> None:
        body = (await receive())["body"]  # the guard's replay: the whole body, read already
        path = scope.get("path", "")
        answer = self.call(request_of(scope, body, self.receiving.count, self.with_prompt))
        content_type, began = "", False
        try:
            async for start, piece, more in answer:
                if start is not None:
                    content_type = _header(start["headers"], b"content-type")
                    await send({"type": "http.response.start", **start})
                    began = True
                await send({"type": "http.response.body", "body": piece, "more_body": more})
        except Exception as e:  # noqa: BLE001  (the replica's end, whatever it was, is answered)
            await self._failed(e, path, content_type, began, send)
        finally:
            with contextlib.suppress(Exception):  # the client left: the replica stops its work
                await _close(answer)

    async def _failed(self, error: Exception, path: str, content_type: str, began: bool,
                      send) -> None:
        gone = unavailable(error)
        message = (f"the model's replica stopped ({errors.one_line(error)}); it is being "
                   f"restarted: retry later" if gone else
                   f"the server failed: {errors.one_line(error)}")
        log.warning("request to %s: %s", path, message)
        if began:
            await send({"type": "http.response.body", "more_body": False,
                        "body": cut_short_ending(content_type, path, message)})
            return
        data, headers = errors.encoded(path, 503 if gone else 500, message)
        await send({"type": "http.response.start", "status": 503 if gone else 500,
                    "headers": headers})
        await send({"type": "http.response.body", "body": data})


class ReplicaHttp:
    """The replica side: runs `app` (http_api's FastAPI app over this replica) on one
    forwarded request and yields its answer as Items, joining the pieces that are ready."""

    def __init__(self, app, window_s: float = 0.0):
        self.app, self.window_s = app, window_s

    async def answer(self, request: Forwarded) -> AsyncIterator[Item]:
        sent: asyncio.Queue[dict | None] = asyncio.Queue()  # the app's messages; None: it ended
        gone = asyncio.Event()  # set when the ingress stops listening (client left, or done)
        task = asyncio.create_task(self.app(request.scope, _receiver(request.body, gone),
                                            _sender(sent)))
        task.add_done_callback(lambda _: sent.put_nowait(None))
        try:
            began, ended = False, False
            while not ended:
                start, piece, ended = _join(await self._ready(sent, hold=began))
                if not began and start is None:
                    if ended:  # the app ended without answering (it raised before its start)
                        yield _no_answer()
                    continue
                yield (None if began else start), piece, not ended
                began = True
        finally:
            gone.set()
            if not task.done():
                task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _ready(self, sent: asyncio.Queue, hold: bool) -> list[dict | None]:
        """The next message, then every one queued behind it; with a window (`hold`: not
        before the answer began), those that come within window_s too."""
        messages = [await sent.get()]
        while not sent.empty():
            messages.append(sent.get_nowait())
        if not (hold and self.window_s > 0):
            return messages
        loop = asyncio.get_running_loop()
        until = loop.time() + self.window_s
        while not _final(messages[-1]) and (left := until - loop.time()) > 0:
            try:
                messages.append(await asyncio.wait_for(sent.get(), left))
            except TimeoutError:
                break
        return messages


def _final(message: dict | None) -> bool:
    return message is None or (message["type"] == "http.response.body"
                               and not message.get("more_body", False))


def _join(messages: list[dict | None]) -> tuple[dict | None, bytes, bool]:
    """(the response start if among them, the body pieces joined, the answer complete)."""
    start, pieces, ended = None, [], False
    for m in messages:
        if m is not None and m["type"] == "http.response.start":
            start = {"status": m["status"], "headers": list(m.get("headers") or [])}
        elif m is not None and m["type"] == "http.response.body":
            pieces.append(m.get("body", b""))
        ended = ended or _final(m)
    return start, b"".join(pieces), ended


def _no_answer() -> Item:
    data, headers = errors.encoded("", 500, "the server failed before it answered")
    return {"status": 500, "headers": headers}, data, False


def _receiver(body: bytes, gone: asyncio.Event) -> Callable[[], Awaitable[dict]]:
    """The app's receive(): the body once, then a disconnect when the ingress stops listening."""
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    return receive


def _sender(sent: asyncio.Queue) -> Callable[[dict], Awaitable[None]]:
    async def send(message: dict) -> None:
        sent.put_nowait(message)

    return send


def _header(headers: list, name: bytes) -> str:
    for key, value in headers:
        if bytes(key).lower() == name:
            return bytes(value).decode("latin-1")
    return ""


async def _close(answer) -> None:
    if hasattr(answer, "cancel"):  # a DeploymentResponseGenerator: the replica's call ends
        answer.cancel()
    elif hasattr(answer, "aclose"):
        await answer.aclose()


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
