"""The OpenAI API for generation engines (docs/serving.md), on the FastAPI app of one replica:

    GET  /v1/models                 {"object": "list", "data": [{"id": <recipe>, ...}]}
    GET  /v1/models/<recipe>        that one model card
    POST /v1/chat/completions       messages through the model's own chat template
    POST /v1/completions            a prompt (text, or token ids) continued

Both POSTs answer in OpenAI's shapes (openai_protocol.py), streamed as server-sent events
(`data: {chunk}` ... `data: [DONE]`) with `stream: true`. Text comes from the model's own
tokenizer (served_tokenizer) through data/text_stream.py: stable text only, cut before a
`stop` string, whose appearance ends the generation at once (the replica's token iterator
is closed, which frees its sequence). Errors are OpenAI's error body: 400
invalid_request_error (naming the field), 404 for another model, 503 with Retry-After when
the replica's queue is full, 500 when the engine fails (mid-stream: an error event, then
[DONE]); the replica keeps serving the other requests either way.

`routes(app, get_replica, recipe_name)` adds them (http_api.routes calls it).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request).
import asyncio
import contextlib
import logging
import time
from pathlib import Path

from pipeline.core.json_object import JsonObject
from pipeline.data.text_stream import TextStream
from pipeline.data.tokenizer import Tokenizer
from pipeline.generation.sampling import InvalidSampling, SamplingParams
from pipeline.serving.batcher import QueueFull
from pipeline.serving.collate import BadRequest
from pipeline.serving.openai_protocol import (
    COMPLETIONS_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DONE,
    Answer,
    ApiError,
    ChatRequest,
    CompletionRequest,
    Sampling,
    bad_request,
    event,
    parse,
    usage,
)

log = logging.getLogger(__name__)
RETRY_AFTER_S = 1  # what a 503 tells the client to wait: a queue slot frees per finished reply
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering


def served_tokenizer(recipe, engine: Path | None) -> Tokenizer:
    """The served model's tokenizer: the files `pipeline run` ships beside the engine (the
    model's tokenizer.json, its config and chat template: genai_config.TOKENIZER_FILES,
    checked against the manifest when the replica opened the folder), else the chat
    workload's (`workload.chat.tokenizer`), else UTF-8 bytes (a byte-level model, as
    `pipeline generate` reads it)."""
    folder = engine.parent if engine is not None else None
    if folder is not None and (folder / "tokenizer.json").is_file():
        return Tokenizer.from_folder(folder, f"{folder}")
    if recipe.workload.chat is not None:
        from pipeline.generation.chat import chat_tokenizer

        return chat_tokenizer(recipe)
    return Tokenizer()


def routes(app, get_replica, recipe_name: str) -> None:
    """Adds the routes above to `app`; a request naming another model gets 404."""
    from fastapi import Request

    created = int(time.time())
    server = _Server(get_replica, recipe_name)
    app.state.openai = server  # a replica preloads its tokenizer through it (app.py)

    def card() -> JsonObject:
        return {"id": recipe_name, "object": "model", "created": created, "owned_by": "pipeline"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{name}")
    async def model(name: str):
        if name != recipe_name:
            return _error(_unknown_model(name, recipe_name))
        return card()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await server.answer(ChatRequest, await request.body())

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await server.answer(CompletionRequest, await request.body())


class _Server:
    """The two POST routes' shared path: parse, prompt, sampling, generate, answer."""

    def __init__(self, get_replica, recipe_name: str):
        self.get_replica, self.recipe_name = get_replica, recipe_name
        self._tokenizer: tuple[object, Tokenizer] | None = None  # (replica, its tokenizer)
        self._loading = asyncio.Lock()

    def preload(self, replica) -> None:
        """Loads the tokenizer now, before any request (a replica's start): its first chat
        request would otherwise wait seconds for transformers and tokenizer.json."""
        self._tokenizer = (replica, served_tokenizer(replica.recipe, replica.choice.path))

    async def tokenizer(self, replica) -> Tokenizer:
        """Loaded once per replica, off the event loop (a large tokenizer.json takes a while),
        by one thread: requests that come while it loads wait for it. Two threads loading at
        once imported transformers at once, and one of them failed (ImportError: cannot
        import name 'AutoTokenizer' from a half-initialized module: a 500 on a fresh replica)."""
        async with self._loading:
            if self._tokenizer is None or self._tokenizer[0] is not replica:
                tok = await asyncio.to_thread(served_tokenizer, replica.recipe, replica.choice.path)
                self._tokenizer = (replica, tok)
            return self._tokenizer[1]

    async def answer(self, kind: type[Sampling], body: bytes):
        try:
            request = parse(kind, body)
            if request.model != self.recipe_name:
                raise _unknown_model(request.model, self.recipe_name)
            replica = self.get_replica()
            if not replica.engine.generation:
                raise bad_request(f"model `{self.recipe_name}` is not a generation engine: "
                                  f"POST /v1/models/{self.recipe_name}/infer", "model")
            tok = await self.tokenizer(replica)
            chat = isinstance(request, ChatRequest)
            prompt = _chat_prompt(tok, request) if chat else _completion_prompt(tok, request)
            params = _sampling(request, len(prompt), _context(replica),
                               tuple(sorted(tok.stop_ids(None))) if chat else ())
            reply = Reply(replica.generate(prompt, params), TextStream(tok, request.stop_strings()),
                          len(prompt))
            await reply.start()  # a bad request or a full queue raises here, before any answer
        except ApiError as e:
            return _error(e)
        except BadRequest as e:
            return _error(bad_request(str(e)))
        except QueueFull as e:
            return _error(ApiError(503, f"the server is busy: {e}; retry later", "server_error",
                                   code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)}))
        except Exception as e:  # the engine failed: this request only, the server goes on
            log.exception("generation failed")
            return _error(ApiError(500, _one_line(e), "server_error"))
        answer = Answer(chat, self.recipe_name)
        if request.stream:
            from fastapi.responses import StreamingResponse

            return StreamingResponse(_events(reply, answer, request.include_usage()),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        return await _whole(reply, answer)


class Reply:
    """One generation as text: the replica's items ({"token"}..., then {"done"}) through a
    TextStream, counting tokens and keeping why it finished."""

    def __init__(self, items, text: TextStream, prompt_tokens: int):
        self.items, self.text, self.prompt_tokens = items, text, prompt_tokens
        self.completion_tokens = 0
        self.cached_tokens: int | None = None  # from the replica's summary, when it came
        self.finish_reason = "stop"
        self._first = None

    async def start(self) -> None:
        """Waits for the first item: admission errors (BadRequest, QueueFull) raise here."""
        self._first = await anext(self.items, None)

    def usage(self) -> JsonObject:
        return usage(self.prompt_tokens, self.completion_tokens, self.cached_tokens)

    async def deltas(self):
        """The reply's text, piece by piece as it becomes stable."""
        item = self._first
        try:
            while item is not None:
                if "token" in item:
                    self.completion_tokens += 1
                    if delta := self.text.add(item["token"]):
                        yield delta
                    if self.text.stopped:
                        break  # a stop string: no more tokens wanted
                else:
                    self.finish_reason = item["finish_reason"]
                    self.cached_tokens = item.get("cached_tokens")
                item = await anext(self.items, None)
        finally:
            # frees the sequence now when a stop string, an error or the client ended it early
            await self.items.aclose()
        if rest := self.text.finish():
            yield rest
        if self.text.stopped:
            self.finish_reason = "stop"


async def _whole(reply: Reply, answer: Answer):
    from fastapi.responses import JSONResponse

    try:
        async with contextlib.aclosing(reply.deltas()) as deltas:
            async for _ in deltas:
                pass
    except Exception as e:
        log.exception("generation failed")
        return _error(ApiError(500, _one_line(e), "server_error"))
    return JSONResponse(answer.whole(reply.text.text, reply.finish_reason, reply.usage()))


async def _events(reply: Reply, answer: Answer, include_usage: bool):
    """The server-sent events of one streamed reply: a chat's role first, a chunk per piece of
    text, the finish reason, the usage if asked, [DONE]. A failure after the answer began is
    an error event (the status line is sent already), then [DONE]."""
    if answer.chat:
        yield event(answer.chunk(None, first=True, with_usage=include_usage))
    try:
        async with contextlib.aclosing(reply.deltas()) as deltas:
            async for delta in deltas:
                yield event(answer.chunk(delta, with_usage=include_usage))
    except Exception as e:
        log.exception("generation failed mid-stream")
        yield event(ApiError(500, _one_line(e), "server_error").body())
        yield DONE
        return
    yield event(answer.chunk(None, reply.finish_reason, with_usage=include_usage))
    if include_usage:
        yield event(answer.usage_chunk(reply.usage()))
    yield DONE


def _chat_prompt(tok: Tokenizer, request: ChatRequest) -> list[int]:
    """The conversation through the model's chat template (Tokenizer.conversation), ending
    with the prompt for the assistant's reply."""
    messages = [m.as_template_message() for m in request.messages]
    try:
        return tok.conversation(messages)
    except Exception as e:  # a template may refuse a role or an order (jinja raise_exception)
        raise bad_request(f"the model's chat template refused the messages: {_one_line(e)}",
                          "messages") from None


def _completion_prompt(tok: Tokenizer, request: CompletionRequest) -> list[int]:
    prompt = request.prompt
    if isinstance(prompt, list) and isinstance(prompt[0], int):
        return list(prompt)
    text = prompt[0] if isinstance(prompt, list) else prompt
    # raw text, framed as the tokenizer frames a sequence (its BOS), as OpenAI servers do
    ids = tok.encode(text, special_tokens=True)
    if not ids:
        raise bad_request("the prompt is empty", "prompt")
    return ids


def _context(replica) -> int:
    from pipeline.generation.decoder import context_length

    return context_length(replica.recipe)


def _sampling(request: Sampling, prompt_tokens: int, context: int,
              stop_ids: tuple[int, ...]) -> SamplingParams:
    """The request's SamplingParams: max_tokens within what the context leaves (chat: all of
    it by default; completions: 16, OpenAI's default), OpenAI's default temperature (1)."""
    room = context - prompt_tokens
    where = "messages" if isinstance(request, ChatRequest) else "prompt"
    if room < 1:
        raise ApiError(400, f"the prompt holds {prompt_tokens} tokens; the model's context is "
                       f"{context} tokens, with room for at least one more",
                       param=where, code="context_length_exceeded")
    wanted = request.max_new_tokens()
    if wanted is None:
        wanted = room if isinstance(request, ChatRequest) else min(COMPLETIONS_MAX_TOKENS, room)
    if wanted > room:
        param = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
        raise ApiError(400, f"{param}={wanted} with the prompt's {prompt_tokens} tokens exceeds "
                       f"the model's context of {context} tokens (at most {room})",
                       param=param, code="context_length_exceeded")
    temperature = DEFAULT_TEMPERATURE if request.temperature is None else request.temperature
    try:
        return SamplingParams(max_new_tokens=wanted, temperature=float(temperature),
                              top_p=1.0 if request.top_p is None else float(request.top_p),
                              top_k=max(0, request.top_k or 0), seed=request.seed,
                              ignore_eos=bool(request.ignore_eos),
                              stop_token_ids=() if request.ignore_eos else stop_ids)
    except InvalidSampling as e:
        raise bad_request(str(e)) from None


def _unknown_model(name: str, served: str) -> ApiError:
    return ApiError(404, f"the model `{name}` does not exist here (this server serves "
                    f"`{served}`)", param="model", code="model_not_found")


def _error(e: ApiError):
    from fastapi.responses import JSONResponse

    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"
