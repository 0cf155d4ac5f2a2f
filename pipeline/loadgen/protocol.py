"""What `pipeline load` sends, in the protocols every server and client already speak:

- tensor models: Triton's KServe v2 `POST {base}/v2/models/<model>/infer`, with the binary
  tensor data extension when the server lists it in `GET /v2` (a JSON header, its length in
  Inference-Header-Content-Length, then the raw little-endian tensors; the outputs asked back
  binary too), else JSON tensors (flat `data`);
- generation models: the OpenAI API, streamed (`stream: true`, `stream_options.include_usage`):
  `POST {base}/v1/chat/completions` with the recipe's chat questions when it has a chat
  workload, else `POST {base}/v1/completions` with its prompts as token ids; greedy
  (temperature 0), `max_tokens` the workload's new_tokens.

Every body is encoded once, before the run (Payload): a request costs the client a send, not
a json.dumps. A Target is where they go: the server's base URL and the model's name there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from pipeline.core.errors import InputError
from pipeline.core.json_object import JsonObject

Api = Literal["kserve", "completions", "chat"]
HEADER_LENGTH = "Inference-Header-Content-Length"
# recipe dtype (numpy's name) -> KServe v2 datatype
DATATYPES = {"float32": "FP32", "float16": "FP16", "float64": "FP64", "int64": "INT64",
             "int32": "INT32", "int8": "INT8", "uint8": "UINT8", "bool": "BOOL"}
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class Target:
    """Where requests go: the server's base URL (scheme, host, port and any path prefix) and
    the model's name there; `api` how to speak to it; `binary`: KServe binary tensors."""

    base: str
    model: str
    api: Api = "kserve"
    binary: bool = False

    @property
    def generate(self) -> bool:
        return self.api != "kserve"

    @property
    def endpoint(self) -> str:
        if self.api == "kserve":
            return f"{self.base}/v2/models/{self.model}/infer"
        return f"{self.base}{PATHS[self.api]}"


@dataclass(frozen=True)
class Payload:
    """One request's body, encoded, and its headers."""

    data: bytes
    headers: dict[str, str]


# /v1/models/<name>[/infer|/generate|/ready] (this project's old routes), /v2/models/<name>[...]
_MODEL_PATH = re.compile(r"^(?P<prefix>.*?)/v[12]/models/(?P<model>[^/]+)(/.*)?$")


def resolve(url: str, model: str | None, default_model: str) -> tuple[str, str]:
    """--url (and --model) -> (base URL, model name). A URL naming a model
    (http://h:8000/v1/models/minilm, .../v2/models/minilm) gives its name unless --model
    says otherwise; an OpenAI base URL (http://h:8000/v1) is the server's base plus /v1."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(f"--url {url}: not an http(s) URL", "e.g. --url http://127.0.0.1:8000")
    path = parts.path.rstrip("/")
    named = _MODEL_PATH.match(path)
    if named:
        path = named["prefix"]
    elif path.endswith("/v1") or path.endswith("/v2"):
        path = path[:-3]
    base = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return base, model or (named["model"] if named else default_model)


def kserve_payload(arrays: dict[str, np.ndarray], dtypes: dict[str, str], binary: bool) -> Payload:
    """One KServe v2 request of these arrays (each cast to its input's dtype)."""
    inputs, blobs = [], []
    for name, value in arrays.items():
        array = np.ascontiguousarray(value, dtype=dtypes.get(name, value.dtype))
        entry: JsonObject = {"name": name, "shape": list(array.shape),
                             "datatype": DATATYPES[array.dtype.name]}
        if binary:
            raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = array.ravel().tolist()
        inputs.append(entry)
    body: JsonObject = {"inputs": inputs}
    if binary:  # the outputs back as raw tensors too: neither side formats numbers as text
        body["parameters"] = {"binary_data_output": True}
    header = json.dumps(body).encode()
    if not binary:
        return Payload(header, {"Content-Type": "application/json"})
    return Payload(header + b"".join(blobs), {"Content-Type": "application/octet-stream",
                                              HEADER_LENGTH: str(len(header))})


def openai_payload(target: Target, prompt: str | list[int], new_tokens: int) -> Payload:
    """One streamed, greedy OpenAI request: a chat question (a user message) or a prompt."""
    body: JsonObject = {"model": target.model, "max_tokens": new_tokens, "temperature": 0,
                        "stream": True, "stream_options": {"include_usage": True}}
    if target.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return Payload(json.dumps(body).encode(), {"Content-Type": "application/json"})
