"""The OpenAI API of `pipeline serve` (serving/openai_api.py), spoken to by the official
`openai` client: a real replica of the trained byte-level chat model (lm-gen with its chat
workload: UTF-8 bytes, `Question:`/`Answer:` turns, a newline ends a reply) on the HTTP app
that the Ray Serve deployment builds (http_api.routes), served by uvicorn in a thread.

Failures the real engine cannot be made to show on demand (a full queue, an engine error
mid-reply, a reply that never ends) come from stand-ins of the replica's generate contract."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pipeline.data.tokenizer import Tokenizer
from tests.conftest import shared_build

openai = pytest.importorskip("openai")

# lm-gen as a chat model, a workload of a few tokens (built in ~15 s): a context of 193 tokens
BUILD = ("lm-gen", "--target", "onnxruntime", "--set", "workload.prompt_lengths=[8]",
         "--set", "workload.new_tokens=4", "--set", "workload.batch_sizes=[1]",
         "--set", "workload.long=null", "--set", "workload.task=[{prompt: 6, new_tokens: 3}]",
         "--set", "optimize.passes=[attention_with_past]",
         "--set", "workload.chat={tokenizer: bytes, scripts: 1, answer_tokens: 4, "
                  "perplexity_tokens: 96, window: 32, max_context: 192}")
SPEAK = [{"role": "user", "content": "Speak"}]


@contextlib.contextmanager
def serving(get_replica, name: str, api_key: str | None = None, base: str = "/v1",
            log_level: str = "warning"):
    """The replica's HTTP app on a free port; yields the URL of `base` (the OpenAI API's by
    default). The socket listens before the server starts, so the first request waits in its
    backlog, never on a sleep."""
    import uvicorn
    from fastapi import FastAPI

    from pipeline.serving import http_api

    app = FastAPI()
    http_api.routes(app, get_replica, name, api_key)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}{base}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    from pipeline.serving.replica import Replica
    from pipeline.store.folder_names import load

    built = shared_build(tmp_path_factory, "lm-gen-chat-openai", *BUILD)
    recipe = load(built.built.name, (), built.engines)
    served = Replica(recipe, built.engines, None, recipe.serve, 1)
    yield served
    served.close()


@pytest.fixture(scope="module")
def server(replica):
    with serving(lambda: replica, replica.recipe.name) as url:
        yield url


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server, api_key="unused", max_retries=0, timeout=120)


def model_name(replica) -> str:
    return replica.recipe.name


def test_models_lists_the_served_recipe(client, replica):
    assert [m.id for m in client.models.list()] == [model_name(replica)]
    assert client.models.retrieve(model_name(replica)).owned_by == "pipeline"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def collect(stream) -> tuple[list, str]:
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


def test_a_streamed_chat_reply_stops_at_end_of_sequence_with_usage(client, replica):
    """Sampled replies of the byte model end at its newline (its end of sequence) after a few
    words; the first seed whose reply has words shows it. Streamed and not, the same seed gives
    the same reply."""
    prompt = len(Tokenizer().conversation(SPEAK))
    for seed in range(10):
        stream = client.chat.completions.create(
            model=model_name(replica), messages=SPEAK, temperature=0.8, seed=seed, max_tokens=120,
            stream=True, stream_options={"include_usage": True})
        chunks, text = collect(stream)
        if text:
            break
    assert text, "no seed in 0..9 gave a reply with text"
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    assert chunks[-2].choices[0].finish_reason == "stop" and chunks[-1].choices == []
    assert all(c.usage is None for c in chunks[:-1])
    used = chunks[-1].usage
    assert used.prompt_tokens == prompt and 0 < used.completion_tokens < 120
    assert used.total_tokens == prompt + used.completion_tokens
    assert used.completion_tokens == len(text.encode())  # one byte a token; the newline not returned
    whole = client.chat.completions.create(model=model_name(replica), messages=SPEAK,
                                           temperature=0.8, seed=seed, max_tokens=120)
    assert whole.choices[0].message.content == text and whole.choices[0].finish_reason == "stop"
    assert whole.choices[0].message.role == "assistant" and whole.object == "chat.completion"
    assert whole.usage.model_dump() == used.model_dump()


def test_ignore_eos_generates_exactly_max_tokens(client, replica):
    """vLLM's `ignore_eos` (what serving benchmarks send): the seed whose sampled reply ended
    at its newline above goes on to max_tokens, finish_reason length."""
    for seed in range(10):
        ended = client.chat.completions.create(model=model_name(replica), messages=SPEAK,
                                               temperature=0.8, seed=seed, max_tokens=120)
        if ended.choices[0].finish_reason == "stop":
            break
    assert ended.choices[0].finish_reason == "stop", "no seed in 0..9 ended by itself"
    forced = client.chat.completions.create(model=model_name(replica), messages=SPEAK,
                                            temperature=0.8, seed=seed, max_tokens=120,
                                            extra_body={"ignore_eos": True})
    assert forced.choices[0].finish_reason == "length" and forced.usage.completion_tokens == 120


def test_max_tokens_ends_a_reply_with_length(client, replica):
    """Greedy (temperature 0), this model repeats words and never ends a line by itself."""
    for limit in ({"max_tokens": 12}, {"max_completion_tokens": 12}):
        reply = client.chat.completions.create(model=model_name(replica), messages=SPEAK,
                                               temperature=0, **limit)
        assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 12
        assert len(reply.choices[0].message.content.encode()) == 12


def test_a_stop_string_cuts_the_reply_and_ends_the_generation(client, replica):
    greedy = client.chat.completions.create(model=model_name(replica), messages=SPEAK,
                                            temperature=0, max_tokens=60).choices[0].message.content
    stop = greedy[20:24]
    expected = greedy[:greedy.index(stop)]
    reply = client.chat.completions.create(model=model_name(replica), messages=SPEAK,
                                           temperature=0, max_tokens=60, stop=[stop, "never seen"])
    assert reply.choices[0].message.content == expected and reply.choices[0].finish_reason == "stop"
    # the generation stopped at the token that completed the stop string
    assert reply.usage.completion_tokens == len((expected + stop).encode()) < 60
    _, streamed = collect(client.chat.completions.create(
        model=model_name(replica), messages=SPEAK, temperature=0, max_tokens=60, stop=stop, stream=True))
    assert streamed == expected


def test_completions_continue_a_prompt_given_as_text_or_token_ids(client, replica):
    text = client.completions.create(model=model_name(replica), prompt="ROMEO:\n", temperature=0,
                                     max_tokens=20)
    assert text.object == "text_completion" and text.choices[0].finish_reason == "length"
    assert text.usage.prompt_tokens == 7 and text.usage.completion_tokens == 20
    ids = client.completions.create(model=model_name(replica), prompt=list(b"ROMEO:\n"),
                                    temperature=0, max_tokens=20)
    assert ids.choices[0].text == text.choices[0].text
    chunks = list(client.completions.create(model=model_name(replica), prompt="ROMEO:\n",
                                            temperature=0, max_tokens=20, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    default = client.completions.create(model=model_name(replica), prompt="ROMEO:\n", temperature=0)
    assert default.usage.completion_tokens == 16  # OpenAI's default max_tokens for completions


def test_a_seed_makes_sampling_reproducible(client, replica):
    def reply(seed):
        return client.completions.create(model=model_name(replica), prompt="ROMEO:\n", temperature=1.0,
                                         top_p=0.95, seed=seed, max_tokens=24,
                                         extra_body={"top_k": 40}).choices[0].text

    assert reply(7) == reply(7)
    assert len({reply(seed) for seed in range(4)}) > 1  # a different seed, other draws


def raw_post(base: str, path: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(base + path, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("fields, param", [
    ({"n": 2}, "n"),
    ({"temperature": 5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 5000}, "max_tokens"),
    ({"stop": ""}, "stop"),
    ({"logprobs": True}, "logprobs"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content"),
])
def test_a_bad_request_is_a_400_in_openais_shape_and_the_server_goes_on(client, replica, fields, param):
    request = {"model": model_name(replica), "messages": SPEAK, **fields}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**request)
    error = refused.value.body
    assert refused.value.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == param and error["message"]
    after = client.chat.completions.create(model=model_name(replica), messages=SPEAK, temperature=0,
                                           max_tokens=3)
    assert after.usage.completion_tokens == 3


def test_a_body_that_is_not_a_request_is_a_400(server, replica):
    for body in (b"{not json", b"[1, 2]", json.dumps({"model": model_name(replica)}).encode()):
        status, answer = raw_post(server, "/chat/completions", body)
        assert status == 400 and set(answer["error"]) == {"message", "type", "param", "code"}
    status, answer = raw_post(server, "/completions", json.dumps(
        {"model": model_name(replica), "prompt": ["one", "two"]}).encode())
    assert status == 400 and answer["error"]["param"] == "prompt"


def test_an_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=SPEAK)
    assert missing.value.body["code"] == "model_not_found" and missing.value.body["param"] == "model"


def test_sixteen_concurrent_streamed_requests_are_all_answered(server, replica):
    async def one(client, i: int) -> tuple[str, str | None]:
        stream = await client.chat.completions.create(
            model=model_name(replica), messages=[{"role": "user", "content": f"Speak {i}"}],
            temperature=0.8, seed=i, max_tokens=24, stream=True,
            stream_options={"include_usage": True})
        text, finish, used = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            used = chunk.usage or used
        assert used is not None and used.completion_tokens <= 24
        return text, finish

    async def all_of_them():
        async with openai.AsyncOpenAI(base_url=server, api_key="unused", max_retries=0,
                                      timeout=300) as client:
            return await asyncio.gather(*(one(client, i) for i in range(16)))

    answers = asyncio.run(all_of_them())
    assert len(answers) == 16 and all(finish in ("stop", "length") for _, finish in answers)


# ----------------------------------------------------------------------------- stand-ins
class StandIn:
    """The real replica (its recipe, engine, tokenizer folder) with another generate."""

    def __init__(self, real, generate):
        self.real, self.generate = real, generate

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_a_full_queue_is_a_503_with_retry_after(replica):
    from pipeline.serving.batcher import QueueFull

    async def full(prompt_ids, params):
        raise QueueFull("queue full (64 requests waiting)")
        yield  # an async generator, as the replica's is

    with serving(lambda: StandIn(replica, full), model_name(replica)) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as busy:
            client.chat.completions.create(model=model_name(replica), messages=SPEAK)
    assert busy.value.status_code == 503 and busy.value.response.headers["retry-after"] == "1"
    assert busy.value.body["code"] == "queue_full"


def test_an_engine_failure_is_a_500_or_an_error_event_and_the_server_goes_on(replica):
    calls = []

    async def failing(prompt_ids, params):
        calls.append(1)
        if len(calls) % 2:  # every other request fails after two tokens
            yield {"token": 65}
            yield {"token": 66}
            raise RuntimeError("the engine failed")
        async for item in replica.generate(prompt_ids, params):
            yield item

    with serving(lambda: StandIn(replica, failing), model_name(replica)) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError) as failed:
            client.chat.completions.create(model=model_name(replica), messages=SPEAK)
        assert "the engine failed" in failed.value.body["message"]
        ok = client.chat.completions.create(model=model_name(replica), messages=SPEAK,
                                            temperature=0, max_tokens=3)
        assert ok.usage.completion_tokens == 3
        with pytest.raises(openai.APIError, match="the engine failed"):
            list(client.chat.completions.create(model=model_name(replica), messages=SPEAK, stream=True))


def test_a_client_that_goes_away_mid_stream_frees_its_sequence(replica):
    closed = threading.Event()

    async def endless(prompt_ids, params):
        try:
            while True:
                yield {"token": 97}
                await asyncio.sleep(0.001)  # the pace of a decode step
        finally:
            closed.set()

    with serving(lambda: StandIn(replica, endless), model_name(replica)) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        with client.chat.completions.create(model=model_name(replica), messages=SPEAK,
                                            max_tokens=150, stream=True) as stream:
            next(iter(stream))
        assert closed.wait(timeout=60), "the replica's token iterator was never closed"


def test_the_tokenizer_comes_from_the_engines_folder_else_the_chat_workload(replica, tmp_path):
    from pipeline.serving.openai_api import served_tokenizer

    assert served_tokenizer(replica.recipe, replica.choice.path).is_bytes  # lm-gen: bytes
    from tests.data.test_text_stream import bpe

    bpe().hf.save_pretrained(str(tmp_path))  # a folder with the model's tokenizer.json
    found = served_tokenizer(replica.recipe, Path(tmp_path) / "onnxruntime.onnx")
    assert not found.is_bytes and found.encode("Paris", False) == bpe().encode("Paris", False)


@pytest.mark.slow
@pytest.mark.parametrize("ingress", ["separate", "replica"])
def test_the_ray_serve_deployment_streams_a_chat_reply_through_its_proxy(replica, ingress):
    """The same routes on `pipeline serve`'s own application (app.start), through Ray Serve's
    HTTP proxy: events arrive as a stream, usage last, then [DONE]; behind the ingress
    deployment, or from the replica itself (serve.ingress)."""
    pytest.importorskip("ray.serve")
    from pipeline.serving import app

    engines = replica.choice.path.parent.parent
    spec = replica.recipe.serve.model_copy(update={"ingress": ingress})
    with app.local_ray(num_cpus=2):
        served = app.start(replica.recipe, engines, spec=spec)
        try:
            client = openai.OpenAI(base_url=f"http://{served.host}:{served.port}/v1",
                                   api_key="unused", max_retries=0, timeout=120)
            chunks, text = collect(client.chat.completions.create(
                model=model_name(replica), messages=SPEAK, temperature=0, max_tokens=10,
                stream=True, stream_options={"include_usage": True}))
            assert chunks[-2].choices[0].finish_reason == "length" and len(text.encode()) == 10
            assert chunks[-1].usage.completion_tokens == 10
        finally:
            served.stop()


def test_a_fresh_replicas_tokenizer_is_loaded_once_by_one_thread(replica, monkeypatch):
    """Requests that arrive together at a fresh server wait for one load of the tokenizer:
    two threads loading it at once imported transformers at once, and one failed (a 500)."""
    import time

    from pipeline.serving import openai_api

    loads = []

    def slow_load(recipe, engine):
        loads.append(threading.get_ident())
        time.sleep(0.3)  # a large tokenizer.json: the window the others arrive in
        return real(recipe, engine)

    real = openai_api.served_tokenizer
    monkeypatch.setattr(openai_api, "served_tokenizer", slow_load)
    with serving(lambda: replica, replica.recipe.name) as url:  # a fresh server: nothing loaded
        body = {"model": replica.recipe.name, "messages": SPEAK, "max_tokens": 2, "temperature": 0}
        results = [None] * 6
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, _post_status(
            f"{url}/chat/completions", body))) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert results == [200] * 6 and len(loads) == 1


def _post_status(url: str, body: dict) -> int:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_preloaded_tokenizer_is_not_loaded_again_by_the_first_request(replica, monkeypatch):
    """The engine replica (app.py) preloads the tokenizer when it starts: the first chat
    request then loads nothing."""
    from fastapi import FastAPI

    from pipeline.serving import http_api, openai_api

    app = FastAPI()
    http_api.routes(app, lambda: replica, replica.recipe.name, None)
    app.state.openai.preload(replica)

    def no_load(recipe, engine):
        raise AssertionError("loaded again at the first request")

    monkeypatch.setattr(openai_api, "served_tokenizer", no_load)
    body = {"model": replica.recipe.name, "messages": SPEAK, "max_tokens": 2, "temperature": 0}
    from fastapi.testclient import TestClient

    with TestClient(app) as http:
        answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2
