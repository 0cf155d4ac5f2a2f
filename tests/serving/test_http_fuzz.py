"""The HTTP API fuzzed (issue 39): hypothesis draws requests for every route family -- the
pipeline's /v1/models/<recipe>/infer and /generate, KServe v2's /v2 routes, the OpenAI
/v1/chat/completions, /v1/completions and /v1/models -- with bodies that are near-valid
(the right fields with wrong types, values out of range, huge or negative sizes), arbitrary
JSON, or raw bytes, under assorted content types and encodings, and sends them to real
servers: the tiny BERT's replica (tensor routes) and the trained byte-level chat model's
(generation routes), each behind uvicorn. Every answer must be a 2xx or a 4xx in its API's
error shape (never a 5xx, never a stream that ends in an error), and the server must answer
a good request afterwards. The number of cases is bounded (a few seconds each server)."""

from __future__ import annotations

import http.client
import json
import urllib.parse

import numpy as np
import pytest

from tests.conftest import shared_build
from tests.serving.test_hostile_requests import serving
from tests.serving.test_openai_api import BUILD
from tests.serving.test_serve import _recipe, tiny  # noqa: F401  (the module-scoped build fixture)

pytestmark = pytest.mark.slow
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = 150  # per server: ~10 s on 2 busy cores
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
OPENAI = ("/v1/chat/completions", "/v1/completions", "/v1/models")

# JSON values of every kind, nested a little: what a field that wants something else gets
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
token_ids = st.integers(-10, 300) | st.sampled_from([-2**63, 2**63 - 1, 2**63, 100_000])
# rows of valid ids (1..127 fits both models) half the time, of anything the other half
id_rows = st.lists(st.integers(1, 127), min_size=2, max_size=32) | st.lists(token_ids, max_size=40)


def _encode(body) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


@st.composite
def infer_bodies(draw):
    """/v1/models/<recipe>/infer: {"inputs": {name: nested list}} nearly right, or anything."""
    row = draw(id_rows)
    mask = draw(st.one_of(st.just([1] * len(row)), st.lists(st.integers(-3, 3), max_size=40)))
    names = draw(st.sampled_from([("input_ids", "attention_mask")] * 3 + [("input_ids",), ("x", "attention_mask")]))
    inputs = {n: draw(st.sampled_from([[v]] * 3 + [v, [[v]], [v, v]])) for n, v in zip(names, (row, mask))}
    return draw(_mostly(st.just({"inputs": inputs})))


@st.composite
def kserve_bodies(draw):
    entries = []
    for name in draw(st.lists(st.sampled_from(["input_ids", "attention_mask", "y"]), max_size=3)):
        row = draw(id_rows)
        entry = {"name": name, "datatype": draw(st.sampled_from(["INT64", "FP32", "BOOL", "INT8", 7])),
                 "shape": draw(st.sampled_from([[1, len(row)], [len(row)], [-1, 2], [2**40, 2**40], "x"])),
                 "data": draw(st.sampled_from([row, [row], "x", None]))}
        if draw(st.booleans()):
            entry["parameters"] = draw(st.sampled_from([{"binary_data_size": 8}, [], {"binary_data_size": -1}]))
        entries.append(entry)
    request = {"inputs": entries}
    if draw(st.booleans()):
        request["outputs"] = draw(st.sampled_from([[{"name": "hidden"}], [{"name": "nope"}], {}, [1]]))
    if draw(st.booleans()):
        request["parameters"] = draw(json_values)
    return draw(_mostly(st.just(request)))


@st.composite
def sampling_fields(draw, model: str) -> dict:
    fields = {"model": draw(st.sampled_from([model, model, "gpt-4o", 3]))}
    for name, values in (("max_tokens", st.integers(-2, 6) | st.sampled_from([10**9, 2.5, "4"])),
                         ("temperature", st.floats(-1, 3) | st.sampled_from([None, "hot"])),
                         ("top_p", st.floats(-0.5, 1.5)), ("top_k", st.integers(-3, 2**64)),
                         ("seed", st.integers(-1, 2**64)), ("n", st.integers(0, 3)),
                         ("stop", json_values), ("stream", st.booleans() | st.just("yes")),
                         ("stream_options", json_values), ("logit_bias", json_values)):
        if draw(st.integers(0, 7)) == 0:
            fields[name] = draw(values)
    fields.setdefault("max_tokens", draw(st.integers(1, 6)))  # keeps each reply short
    return fields


@st.composite
def chat_bodies(draw, model: str):
    message = st.fixed_dictionaries({"role": st.sampled_from(["user"] * 4 + ["system", "assistant", "robot", 1]),
                                     "content": st.text(max_size=30) | st.text(max_size=30) | json_values})
    body = {**draw(sampling_fields(model)), "messages": draw(
        st.lists(message, min_size=1, max_size=3) | st.lists(message, max_size=3) | json_values)}
    return draw(_mostly(st.just(body)))


@st.composite
def completion_bodies(draw, model: str):
    prompt = (st.text(min_size=1, max_size=40) | st.lists(st.integers(0, 255), min_size=1, max_size=20)
              | st.lists(token_ids, max_size=20) | st.lists(st.text(max_size=5), max_size=2))
    body = {**draw(sampling_fields(model)), "prompt": draw(prompt | prompt | json_values)}
    return draw(_mostly(st.just(body)))


@st.composite
def generate_bodies(draw):
    body = {"prompt_ids": draw(id_rows | id_rows | json_values),
            "max_new_tokens": draw(st.integers(-2, 6) | st.sampled_from([10**12, "3", None])),
            "stream": draw(st.booleans())}
    return draw(_mostly(st.just(body)))


def _mostly(near_valid):
    """A near-valid body two times in four; arbitrary JSON or bytes otherwise."""
    return st.one_of(near_valid, near_valid, json_values, st.binary(max_size=64))


def names(model: str):
    return st.sampled_from([model, "other", "%2e%2e", "a" * 300])


def tensor_requests(model: str):
    return st.one_of(
        st.tuples(st.just("POST"), st.just(f"/v1/models/{model}/infer"), infer_bodies(),
                  st.sampled_from([{}, {"Content-Type": "application/x-npz"}])),
        st.tuples(st.just("POST"), st.just(f"/v2/models/{model}/infer"), kserve_bodies(),
                  st.sampled_from([{}, {"Content-Encoding": "gzip"}, {"Content-Encoding": "br"},
                                   {"Inference-Header-Content-Length": "5"},
                                   {"Inference-Header-Content-Length": "-1"}])),
        st.tuples(st.sampled_from(["GET", "POST", "DELETE"]),
                  names(model).flatmap(lambda n: st.sampled_from(
                      [f"/v2/models/{n}", f"/v2/models/{n}/versions/2/ready", f"/v1/models/{n}/ready",
                       f"/v1/models/{n}/stats", "/v2", "/health", "/metrics", "/v1/models", "/nowhere"])),
                  st.just(b""), st.just({})))


def generation_requests(model: str):
    return st.one_of(
        st.tuples(st.just("POST"), st.just("/v1/chat/completions"), chat_bodies(model), st.just({})),
        st.tuples(st.just("POST"), st.just("/v1/completions"), completion_bodies(model), st.just({})),
        st.tuples(st.just("POST"), st.just(f"/v1/models/{model}/generate"), generate_bodies(), st.just({})),
        st.tuples(st.just("GET"), names(model).map(lambda n: f"/v1/models/{n}"), st.just(b""), st.just({})))


class Tally:
    """Cases sent and the ones answered wrongly (with what came back)."""

    def __init__(self):
        self.cases, self.failures = 0, []
        self.statuses: dict[int, int] = {}

    def check(self, url: str, method: str, path: str, body, headers: dict) -> int:
        self.cases += 1
        address = urllib.parse.urlsplit(url)
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=120)
        try:
            connection.request(method, path, body=_encode(body) or None,
                               headers={"Content-Type": "application/json", **headers})
            response = connection.getresponse()
            raw = response.read()
        finally:
            connection.close()
        self.statuses[response.status] = self.statuses.get(response.status, 0) + 1
        problem = _problem(path, response.status, response.getheader("content-type", ""), raw)
        if problem:
            self.failures.append((method, path, _encode(body)[:200], response.status, problem, raw[:300]))
        return response.status


def _problem(path: str, status: int, content_type: str, raw: bytes) -> str | None:
    """What is wrong with this answer, or None."""
    if status >= 500 or not 200 <= status < 500:
        return f"status {status}"
    if "text/event-stream" in content_type:
        events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
        if events[-1:] != ["[DONE]"] or any('"error"' in e for e in events):
            return "the stream did not end with [DONE], or held an error event"
        return None
    if "ndjson" in content_type:
        lines = [json.loads(line) for line in raw.decode().splitlines()]
        return None if lines and lines[-1].get("done") else "the stream did not end with its done line"
    if status < 400 or path == "/metrics":
        return None
    try:
        error = json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        return "an error that is not JSON with an `error` field"
    openai = path in OPENAI or (path.startswith("/v1/models/") and path.count("/") == 3)
    if openai and not (isinstance(error, dict) and isinstance(error.get("message"), str)):
        return "an OpenAI route's error not in OpenAI's shape"
    if not openai and not isinstance(error, str):
        return "an error not a one-line string"
    return None


@pytest.fixture(scope="module")
def tensor_replica(tiny):  # noqa: F811
    from pipeline.serving.replica import Replica

    recipe = _recipe(tiny, max_queue_delay_us=1000)  # a lone request goes after 1 ms
    served = Replica(recipe, tiny.engines, None, recipe.serve, threads=1)
    yield served
    served.close()


@pytest.fixture(scope="module")
def generation_replica(tmp_path_factory):
    from pipeline.serving.replica import Replica
    from pipeline.store.folder_names import load

    built = shared_build(tmp_path_factory, "lm-gen-chat-openai", *BUILD)
    recipe = load(built.built.name, (), built.engines)
    served = Replica(recipe, built.engines, None, recipe.serve, 1)
    yield served
    served.close()


def _fuzz(replica, requests, good: tuple[str, dict]) -> Tally:
    tally = Tally()
    with serving(replica) as url:
        @SETTINGS
        @given(requests)
        def one(request):
            tally.check(url, *request)

        one()
        assert tally.check(url, "POST", good[0], good[1], {}) == 200  # the server goes on serving
    print(f"\nHTTP fuzz, {replica.recipe.name}: {tally.cases} cases, {len(tally.failures)} failures; "
          f"statuses {dict(sorted(tally.statuses.items()))}")
    return tally


def test_the_tensor_routes_answer_every_request_with_a_2xx_or_a_4xx_in_shape(tensor_replica):
    model = tensor_replica.recipe.name
    ids = np.random.default_rng(0).integers(1, 128, 8).tolist()
    good = (f"/v1/models/{model}/infer", {"inputs": {"input_ids": [ids], "attention_mask": [[1] * 8]}})
    tally = _fuzz(tensor_replica, tensor_requests(model), good)
    assert tally.cases >= EXAMPLES // 2 and not tally.failures, tally.failures[:5]


def test_the_generation_routes_answer_every_request_with_a_2xx_or_a_4xx_in_shape(generation_replica):
    model = generation_replica.recipe.name
    good = ("/v1/chat/completions", {"model": model, "max_tokens": 2,
                                     "messages": [{"role": "user", "content": "Speak"}]})
    tally = _fuzz(generation_replica, generation_requests(model), good)
    assert tally.cases >= EXAMPLES // 2 and not tally.failures, tally.failures[:5]


def test_a_generate_stream_that_fails_ends_with_an_error_line_never_silently(generation_replica):
    """Issue 39 (17): a /generate NDJSON stream cut by a failure after its first token ends
    with an {"error"} line (the 200 is sent already), and the server goes on."""
    from tests.serving.test_openai_api import StandIn

    async def failing(prompt_ids, params):
        yield {"token": 65}
        raise RuntimeError("the engine failed mid-stream")

    model = generation_replica.recipe.name
    with serving(StandIn(generation_replica, failing)) as url:
        address = urllib.parse.urlsplit(url)
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=120)
        connection.request("POST", f"/v1/models/{model}/generate",
                           json.dumps({"prompt_ids": [1, 2, 3], "max_new_tokens": 4}))
        response = connection.getresponse()
        lines = [json.loads(line) for line in response.read().decode().splitlines()]
        connection.close()
    assert response.status == 200 and lines[0] == {"token": 65}
    assert "the engine failed mid-stream" in lines[-1]["error"], lines
