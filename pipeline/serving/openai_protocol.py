"""The OpenAI API's shapes, as the server reads and writes them (openai_api.py holds the
routes): the request bodies of /v1/chat/completions and /v1/completions checked field by
field, the answers and stream chunks, and the error body.

Requests are read as OpenAI documents them (platform.openai.com/docs/api-reference/chat):
unknown fields are ignored, as OpenAI's server and vLLM's do; fields this server cannot honour
(n > 1, logprobs, tools, penalties, logit_bias, best_of, echo, suffix, response formats) are
refused with a 400 naming the field rather than silently ignored, since a client that asked
for them would read the answer wrongly.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.core.json_object import JsonObject

# OpenAI's defaults where a request leaves a field out
DEFAULT_TEMPERATURE = 1.0
COMPLETIONS_MAX_TOKENS = 16  # /v1/completions' documented default (chat: what fits the context)


class ApiError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> JsonObject:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


class _Body(BaseModel):
    # JSON types as sent (strict: "0.5" is no number, true no integer); unknown keys ignored
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def as_template_message(self) -> dict[str, str]:
        """{role, content} as chat templates take it: text parts joined, `developer` (OpenAI's
        newer name for the system message) as `system`, which the templates know."""
        text = self.content if isinstance(self.content, str) else \
            "".join(p.text for p in self.content or [])
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(_Body):
    include_usage: bool = False


class Sampling(_Body):
    """The fields both endpoints share: the model, how long, how to choose tokens, streaming."""

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None  # vLLM's extension; -1 or 0: off
    ignore_eos: bool | None = None  # vLLM's extension: exactly max_tokens come (benchmarks)
    seed: Annotated[int, Field(ge=0)] | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def max_new_tokens(self) -> int | None:
        """max_completion_tokens (OpenAI's current name) over max_tokens (its older one)."""
        return self.max_completion_tokens or self.max_tokens

    def stop_strings(self) -> tuple[str, ...]:
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if any(not s for s in stops):
            raise bad_request("stop strings must not be empty", "stop")
        return stops

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def refuse_unsupported(self) -> None:
        """A 400 for each field set to what this server cannot do (see the module docstring)."""
        if self.n not in (None, 1):
            raise bad_request(f"n={self.n}: this server returns one choice per request; send "
                              "n requests instead", "n")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed with stream: true", "stream_options")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0):
                raise bad_request(f"{name} is not supported here (only 0)", name)
        if self.logit_bias:
            raise bad_request("logit_bias is not supported here", "logit_bias")


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list | None = None
    response_format: dict | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs or self.top_logprobs:
            raise bad_request("logprobs are not supported here", "logprobs")
        if self.tools:
            raise bad_request("tools (function calling) are not supported here", "tools")
        if self.response_format and self.response_format.get("type") != "text":
            raise bad_request("only response_format {type: text} is supported here", "response_format")


class CompletionRequest(Sampling):
    # one prompt: its text, a list holding one text, or its token ids
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | \
        Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs:
            raise bad_request("logprobs are not supported here", "logprobs")
        if self.echo:
            raise bad_request("echo is not supported here", "echo")
        if self.suffix:
            raise bad_request("suffix is not supported here", "suffix")
        if self.best_of not in (None, 1):
            raise bad_request("best_of is not supported here (only 1)", "best_of")


# What a field of several forms takes: pydantic's own message names one form's failure only
FORMS = {"content": "a string or a list of {\"type\": \"text\", \"text\": ...} parts",
         "prompt": "a string, a list of one string, or a list of token ids (integers >= 0)",
         "stop": "a string or a list of strings"}


def parse(model: type[Sampling], body: bytes) -> Sampling:
    """The request body as `model`, or a 400 naming the first field that is wrong."""
    try:
        request = model.model_validate_json(body or b"null")
    except ValidationError as e:
        first = e.errors()[0]
        if first["type"] == "json_invalid":
            raise bad_request(f"the body is not JSON ({first['msg']})") from None
        if first["type"] == "model_type":
            raise bad_request("the body must be a JSON object") from None
        loc = list(first["loc"])
        form = next((i for i, part in enumerate(loc) if part in FORMS), None)
        if form is not None:  # the field itself, not the union member pydantic tried
            param = ".".join(str(part) for part in loc[:form + 1])
            raise bad_request(f"{param} must be {FORMS[loc[form]]}", param) from None
        param = ".".join(str(part) for part in loc) or None
        raise bad_request(f"{param}: {first['msg']}" if param else first["msg"], param) from None
    request.refuse_unsupported()
    return request


class Answer:
    """The answer's and the chunks' shapes of one request (ids, names and time fixed once)."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _head(self, kind: str) -> JsonObject:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, text: str, finish_reason: str, usage: JsonObject) -> JsonObject:
        """The non-streamed answer."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "finish_reason": finish_reason, "logprobs": None}
            return {**self._head("chat.completion"), "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        return {**self._head("text_completion"), "choices": [choice], "usage": usage}

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False,
              with_usage: bool = False) -> JsonObject:
        """One streamed chunk of the choice; a chat's first one carries the role. With
        include_usage every chunk has `usage: null` until the last one (usage_chunk)."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else \
                ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
            chunk = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish_reason, "logprobs": None}
            chunk = {**self._head("text_completion"), "choices": [choice]}
        return {**chunk, "usage": None} if with_usage else chunk

    def usage_chunk(self, usage: JsonObject) -> JsonObject:
        """The last chunk of stream_options.include_usage: no choices, the request's usage."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [], "usage": usage}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> JsonObject:
    """OpenAI's usage; `prompt_tokens_details.cached_tokens`: prompt tokens the prefix cache
    held (not prefilled), as OpenAI and vLLM report them, where the replica said."""
    counted = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
               "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        counted["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return counted


def event(data: JsonObject | str) -> str:
    """One server-sent event: `data: <json>` and a blank line (`data: [DONE]` ends a stream)."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


DONE = event("[DONE]")
