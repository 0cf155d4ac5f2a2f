"""Triton's KServe v2 protocol, spoken by Triton's own client (tritonclient.http) to a real
HTTP server (uvicorn, the FastAPI app `pipeline serve` builds) over a real Replica of the
tiny BERT the serving tests build: health and metadata, inference with JSON and binary
tensors answered as the engine answers in process, KServe's errors, and /metrics moving
with the requests served."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import scaled
from tests.serving.test_metrics import TRITON, value
from tests.serving.test_serve import _recipe, tiny  # noqa: F401  (the module-scoped build fixture)

pytestmark = pytest.mark.slow
http = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module")
def server(tiny):  # noqa: F811
    """One Replica (batches of up to 4, a 2 ms delay, 3 places in the queue) behind uvicorn."""
    import uvicorn
    from fastapi import FastAPI

    from pipeline.serving import http_api
    from pipeline.serving.app import free_port
    from pipeline.serving.replica import Replica

    recipe = _recipe(tiny, max_queue_delay_us=2000, max_queue_size=3)
    replica = Replica(recipe, tiny.engines, None, recipe.serve, threads=1)
    api = FastAPI()
    http_api.routes(api, lambda: replica, recipe.name)
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + scaled(30)
    while not uv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn never started"
        time.sleep(0.05)
    yield SimpleNamespace(url=f"127.0.0.1:{port}", name=recipe.name, recipe=recipe, tiny=tiny)
    uv.should_exit = True
    thread.join(timeout=scaled(30))
    replica.close()


def _inputs(ids: np.ndarray, binary: bool) -> list:
    tensors = []
    for name, array in (("input_ids", ids), ("attention_mask", np.ones_like(ids))):
        tensor = http.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array, binary_data=binary)
        tensors.append(tensor)
    return tensors


def _alone(server, ids: np.ndarray) -> np.ndarray:
    """Each row run alone through the engine in process, stacked."""
    from pipeline.serving.engine import ServedEngine, choose

    engine = ServedEngine(server.recipe, choose(server.recipe, server.tiny.engines, None), threads=1)
    try:
        return np.concatenate([engine.infer({"input_ids": row[None], "attention_mask": np.ones_like(row[None])})
                               ["hidden"] for row in ids])
    finally:
        engine.close()


def test_tritonclient_reads_health_and_model_metadata(server):
    client = http.InferenceServerClient(server.url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(server.name) and client.is_model_ready(server.name, "1")
    assert not client.is_model_ready("another") and not client.is_model_ready(server.name, "2")
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    metadata = client.get_model_metadata(server.name)
    assert metadata["versions"] == ["1"] and metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [{"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
                                  {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]}]
    assert metadata["outputs"] == [{"name": "hidden", "datatype": "FP32", "shape": [-1, -1, 32]}]
    assert client.get_model_metadata(server.name, "1") == metadata


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_infers_a_batch_as_the_engine_answers_each_sample_alone(server, binary):
    client = http.InferenceServerClient(server.url)
    ids = np.random.default_rng(4).integers(1, 128, (3, 9)).astype(np.int64)
    # no outputs named: tritonclient asks for every output in binary (binary_data_output)
    outputs = None if binary else [http.InferRequestedOutput("hidden", binary_data=False)]
    result = client.infer(server.name, _inputs(ids, binary), outputs=outputs, request_id="r-7")
    response = result.get_response()
    assert response["id"] == "r-7" and response["model_version"] == "1"
    (entry,) = response["outputs"]
    assert ("parameters" in entry) == binary and ("data" in entry) != binary
    hidden = result.as_numpy("hidden")
    assert hidden.shape == (3, 9, 32) and hidden.dtype == np.float32
    np.testing.assert_allclose(hidden, _alone(server, ids), rtol=1e-4, atol=1e-5)
    assert 1 <= response["parameters"]["batch_size"] <= 3


def _post(url: str, body: dict) -> tuple[int, dict, object]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers


def _body(ids: np.ndarray, datatype: str = "INT64") -> dict:
    return {"inputs": [{"name": n, "shape": list(ids.shape), "datatype": datatype, "data": ids.ravel().tolist()}
                       for n in ("input_ids", "attention_mask")]}


def test_bad_requests_get_kserves_errors(server):
    client = http.InferenceServerClient(server.url)
    ids = np.ones((1, 4), np.int64)
    with pytest.raises(InferenceServerException) as unknown:
        client.infer("another", _inputs(ids, False))
    assert unknown.value.status() == "404" and "another" in unknown.value.message()
    url = f"http://{server.url}/v2/models/{server.name}/infer"
    status, answer, _ = _post(url, _body(ids, "FP32"))
    assert status == 400 and "FP32" in answer["error"] and "INT64" in answer["error"]
    status, answer, _ = _post(url, _body(np.ones((5, 4), np.int64)))
    assert status == 400 and "batch-size must be 1..4" in answer["error"]
    # 4 samples fit a batch but not the queue's 3 places: refused whole, retry later
    status, answer, headers = _post(url, _body(np.ones((4, 4), np.int64)))
    assert status == 503 and answer == {"error": "queue full (0 of 3 places taken; 4 needed)"}
    assert headers.get("Retry-After") == "1"
    status, answer, _ = _post(url, {"inputs": [{"name": "input_ids", "shape": [1, 40], "datatype": "INT64",
                                                "data": [1] * 40}]})
    assert status == 400 and "attention_mask" in answer["error"]


def _scrape(server) -> dict:
    with urllib.request.urlopen(f"http://{server.url}/metrics", timeout=60) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_count_the_samples_batches_and_rejections_served(server):
    labels = {**TRITON, "model": server.name}
    before = _scrape(server)
    client = http.InferenceServerClient(server.url)
    client.infer(server.name, _inputs(np.ones((2, 6), np.int64), True))
    status, _, _ = _post(f"http://{server.url}/v2/models/{server.name}/infer", _body(np.ones((4, 4), np.int64)))
    assert status == 503
    after = _scrape(server)

    def moved(name, **extra):
        return value(after, name, **labels, **extra) - value(before, name, **labels, **extra)

    assert moved("nv_inference_count_total") == moved("nv_inference_request_success_total") == 2
    assert 1 <= moved("nv_inference_exec_count_total") <= 2
    assert moved("nv_inference_request_failure_total") == 4
    assert moved("nv_inference_compute_infer_duration_us_total") > 0
    assert moved("pipeline:inference_batch_size_sum") == 2
    assert moved("pipeline:inference_batch_size_count") == moved("nv_inference_exec_count_total")
    assert value(after, "pipeline:inference_batch_size_bucket", le="2.0", **labels) >= 1
