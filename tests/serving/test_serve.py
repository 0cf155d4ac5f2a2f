"""`pipeline serve` on a real engine: padding invariance, a tampered folder refused (exit 5),
the CLI's cold start checked against the engine in process, and a real local Ray Serve run
that batches requests, answers as the engine does in process, and refuses a full queue with
503 over HTTP. One tiny BERT (random weights, real attention mask) built once."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import FAST, scaled, set_folder, shared_build

pytestmark = pytest.mark.slow

TINY = """\
description: tiny BERT (random weights), token states under a real attention mask
model:
  transformers:
    config: {model_type: bert, num_hidden_layers: 1, hidden_size: 32, num_attention_heads: 2,
             intermediate_size: 64, vocab_size: 128, max_position_embeddings: 64}
    task: hidden_states
inputs:
  - name: input_ids
    dtype: int64
    shape: [{name: batch, min: 1, opt: 2, max: 8}, {name: sequence, min: 2, opt: 16, max: 32}]
    range: [1, 128]
  - name: attention_mask
    dtype: int64
    shape: [{name: batch, min: 1, opt: 2, max: 8}, {name: sequence, min: 2, opt: 16, max: 32}]
    range: [1, 2]
outputs: [hidden]
optimize: {passes: [fold_constants]}
targets: [{kind: onnxruntime}]
serve: {max_batch_size: 4, preferred_batch_sizes: [], max_queue_delay_us: 30000000,
        max_queue_size: 8, length_buckets: {sequence: [8, 16]}}
"""
FOLDER = set_folder("tiny-bert", *FAST)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny BERT built once for the session (serving/test_cluster.py takes it too), this
    module's own copy."""
    return shared_build(tmp_path_factory, "tiny-bert", "tiny-bert", *FAST,
                        recipes={"recipes/tiny-bert.yaml": TINY})


def _recipe(tiny, **serve):
    from pipeline.recipe.serve import ServeSpec
    from pipeline.store.folder_names import load

    recipe = load(str(tiny.path / "recipes" / "tiny-bert.yaml"), FAST_SETS, tiny.engines)
    if serve:
        recipe.serve = ServeSpec.model_validate({**recipe.serve.model_dump(exclude_unset=True), **serve})
    return recipe


FAST_SETS = tuple(FAST[i + 1] for i in range(0, len(FAST), 2))


def _sample(rng, length: int) -> dict[str, np.ndarray]:
    return {"input_ids": rng.integers(1, 128, (1, length)).astype(np.int64),
            "attention_mask": np.ones((1, length), np.int64)}


def test_padding_a_batch_to_its_bucket_leaves_every_answer_as_run_alone(tiny):
    from pipeline.serving import collate
    from pipeline.serving.engine import ServedEngine, choose, output_axes

    recipe = _recipe(tiny)
    choice = choose(recipe, tiny.engines, None)
    axes = output_axes(recipe, choice.graph)
    assert axes == {"hidden": {1: "sequence"}}, "the graph names the padded axis of the output"
    sig = collate.Signature.of(recipe, output_axes=axes)
    engine = ServedEngine(recipe, choice, threads=1)
    rng = np.random.default_rng(0)
    try:
        requests = [_sample(rng, n) for n in (3, 5, 9, 16)]
        checked = [collate.check(sig, r) for r in requests]
        key = collate.bucket(sig, checked[2][1])
        assert key == collate.bucket(sig, checked[3][1]) == (("sequence", 16),)
        pair = [checked[2], checked[3]]  # 9 and 16 padded to 16, batch of 2
        batched = collate.split(sig, engine.infer(collate.stack(sig, [c[0] for c in pair], key)),
                                [c[1] for c in pair])
        short = [checked[0], checked[1]]  # 3 and 5 padded to 8
        key8 = collate.bucket(sig, short[0][1])
        batched = collate.split(sig, engine.infer(collate.stack(sig, [c[0] for c in short], key8)),
                                [c[1] for c in short]) + batched
        for request, answer in zip(requests, batched):
            alone = engine.infer(request)
            for name, value in alone.items():
                assert answer[name].shape == value.shape
                np.testing.assert_allclose(answer[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    finally:
        engine.close()


def test_serve_refuses_a_folder_verify_refuses_with_exit_5(tiny, tmp_path):
    import shutil

    from tests.conftest import Project

    copy = Project(tmp_path / "copy")
    copy.write("recipes/tiny-bert.yaml", TINY)
    shutil.copytree(tiny.engines, copy.engines)
    engine = copy.engines / FOLDER / "onnxruntime.onnx"
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0xFF
    engine.write_bytes(bytes(data))
    result = copy.run("serve", FOLDER, "--check-only", "--num-cpus", "1", timeout=300)
    assert result.code == 5, result.err
    (line,) = result.error_lines
    assert "verify" in line and "onnxruntime.onnx" in line and "--force" in line


def test_the_cli_answers_as_the_engine_in_process_and_records_its_cold_start(tiny):
    from pipeline.serving.app import free_port

    # the module's recipe holds a batch 30 s for company: a lone first request would wait it out
    result = tiny.run("serve", FOLDER, "--check-only", "--num-cpus", "2", "--port", str(free_port()),
                      "--set", "serve.max_queue_delay_us=1000", timeout=600)
    assert result.code == 0, result.err
    record = json.loads((tiny.engines / FOLDER / "serve-start-onnxruntime.json").read_text())
    assert record["checked"].startswith("max |diff|") and record["cold_start_s"] >= record["ready_s"] > 0
    assert record["threads"] == 2  # no serve.threads: the local Ray's 2 CPUs, its one replica's
    (replica,) = record["replica"]
    assert replica["peak_rss_mb"] >= replica["rss_at_load_mb"] > 0 and replica["requests"] >= 1
    assert tiny.run("verify", str(tiny.engines / FOLDER)).code == 0  # recorded like any artifact


# ----------------------------------------------------------------------------- Ray Serve
@pytest.fixture(scope="module")
def ray_local():
    pytest.importorskip("ray.serve")
    from pipeline.serving.app import local_ray

    with local_ray(num_cpus=2):
        yield


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


def _concurrently(fn, args: list) -> list:
    results = [None] * len(args)
    threads = [threading.Thread(target=lambda i=i, a=a: results.__setitem__(i, fn(*a))) for i, a in enumerate(args)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    return results


def test_ray_serve_batches_requests_and_answers_as_the_engine_in_process(tiny, ray_local):
    from pipeline.serving import app
    from pipeline.serving.engine import ServedEngine, choose

    recipe = _recipe(tiny)  # max_batch_size 4, no preferred sizes, a 30 s delay: only 4 send
    server = app.start(recipe, tiny.engines)
    rng = np.random.default_rng(1)
    samples = [_sample(rng, n) for n in (9, 12, 14, 16)]  # one bucket (16)
    bodies = [{"inputs": {k: v.tolist() for k, v in s.items()}} for s in samples]
    answers = _concurrently(_post, [(f"{server.url}/infer", b) for b in bodies])
    assert [a[0] for a in answers] == [200] * 4, answers
    assert {a[1]["batch_size"] for a in answers} == {4}
    assert all(a[1]["compute_ms"] > 0 and a[1]["queue_ms"] >= 0 for a in answers)
    engine = ServedEngine(recipe, choose(recipe, tiny.engines, None), threads=1)
    try:
        for sample, (_, answer) in zip(samples, answers):
            alone = engine.infer(sample)["hidden"]
            np.testing.assert_allclose(np.asarray(answer["outputs"]["hidden"]), alone, rtol=1e-4, atol=1e-5)
        # the in-process handle (no HTTP): the same answers, batched the same way
        responses = [server.handle._handle.infer_arrays.remote(s) for s in samples]
        by_handle = [r.result(timeout_s=120) for r in responses]
        assert {a.batch_size for a in by_handle} == {4}
        for sample, answer in zip(samples, by_handle):
            np.testing.assert_allclose(answer.outputs["hidden"], engine.infer(sample)["hidden"],
                                       rtol=1e-4, atol=1e-5)
    finally:
        engine.close()
    stats = _get(f"{server.url}/stats")
    assert stats["batches"] == {"4": 2} and stats["policy"]["max_batch_size"] == 4
    with urllib.request.urlopen(f"http://{server.host}:{server.port}/metrics", timeout=60) as response:
        metrics = response.read().decode()  # through Ray Serve's proxy: the same two batches
    assert 'nv_inference_exec_count_total{model="tiny-bert",version="1"} 2.0' in metrics
    assert 'pipeline:inference_batch_size_bucket{le="4.0",model="tiny-bert",version="1"} 2.0' in metrics
    assert _post(f"{server.url}/infer", {"inputs": {"input_ids": [[1, 2]]}})[0] == 400
    assert _get(f"http://{server.host}:{server.port}/health") == {"status": "ok"}
    server.stop()


def test_a_full_queue_answers_503_over_http(tiny, ray_local):
    import time

    from pipeline.serving import app

    # two requests fill the queue and wait there (batch 4 never fills) for as long as the
    # batch delay: long enough to post a third, stretched on a busy machine
    delay = scaled(3)
    recipe = _recipe(tiny, max_queue_size=2, max_queue_delay_us=int(delay * 1e6))
    server = app.start(recipe, tiny.engines)
    body = {"inputs": {k: v.tolist() for k, v in _sample(np.random.default_rng(2), 8).items()}}
    waiting = []
    threads = [threading.Thread(target=lambda: waiting.append(_post(f"{server.url}/infer", body)))
               for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + delay
    while _get(f"{server.url}/stats")["queued"] < 2:  # until both wait in the replica's queue
        assert time.monotonic() < deadline and not waiting, "the two requests never queued"
        time.sleep(0.05)
    status, answer = _post(f"{server.url}/infer", body)
    assert (status, answer) == (503, {"error": "queue full"})
    for t in threads:
        t.join(timeout=120)
    assert [w[0] for w in waiting] == [200, 200] and {w[1]["batch_size"] for w in waiting} == {2}
    server.stop()


def test_requests_wait_only_in_the_replicas_bounded_queue_never_in_rays(tiny, ray_local):
    """Issue 39 (11): Ray handed a replica only its queue + a batch + 1 requests at once; the
    rest waited in Ray's own unbounded queue, so 500 concurrent requests all got 200 late,
    none 503. Here 8 clients that send their headers and never their body hold 8 requests
    in the replica (more than its 2 + 4 + 1); 40 requests more must still reach its queue:
    2 wait there and are answered, the others get 503 at once, none waits anywhere else."""
    import socket
    import time

    from pipeline.serving import app

    delay = scaled(3)  # the two queued requests wait this long for company, then go
    recipe = _recipe(tiny, max_queue_size=2, max_queue_delay_us=int(delay * 1e6))
    server = app.start(recipe, tiny.engines)
    head = (f"POST /v1/models/{recipe.name}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
            "application/json\r\nContent-Length: 1000\r\n\r\n").encode()
    stalled = [socket.create_connection((server.host, server.port), timeout=60) for _ in range(8)]
    try:
        for sock in stalled:
            sock.sendall(head)
        # until the replica holds all 8 (with Ray's old cap of 7 this /stats waited in Ray's queue)
        deadline = time.monotonic() + scaled(30)
        while _get(f"{server.url}/stats")["receiving"] < 8:
            assert time.monotonic() < deadline, "the stalled requests never reached the replica"
            time.sleep(0.05)
        body = {"inputs": {k: v.tolist() for k, v in _sample(np.random.default_rng(3), 8).items()}}
        answers = _concurrently(_post, [(f"{server.url}/infer", body)] * 40)
    finally:
        for sock in stalled:
            sock.close()
    statuses = [a[0] if a else None for a in answers]
    assert set(statuses) <= {200, 503}, statuses  # None: a request never answered
    busy = [a[1] for a in answers if a[0] == 503]
    assert statuses.count(200) >= 2 and len(busy) >= 1, statuses
    assert all(b == {"error": "queue full"} for b in busy)
    server.stop()


def test_deploy_writes_the_serve_sections_batching_into_config_pbtxt(tiny, tmp_path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from pipeline.serving import collate

    result = tiny.run("deploy", "tiny-bert", *[a for i in range(0, len(FAST), 2) for a in FAST[i:i + 2]],
                      "--triton", str(tmp_path / "repo"))
    assert result.code == 0, result.err
    (config_path,) = Path(tmp_path / "repo").glob("*/config.pbtxt")
    config = text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())
    sig = collate.Signature.of(_recipe(tiny))
    assert config.max_batch_size == sig.max_batch_size == 4
    batching = config.dynamic_batching
    assert list(batching.preferred_batch_size) == list(sig.preferred) == []
    assert batching.max_queue_delay_microseconds == 30_000_000
    assert batching.default_queue_policy.max_queue_size == 8


def test_the_pytorch_baseline_is_served_through_the_same_engine_interface(tiny):
    from pipeline.serving.engine import PYTORCH, ServedEngine, choose

    recipe = _recipe(tiny)
    sample = _sample(np.random.default_rng(3), 7)
    baseline = ServedEngine(recipe, choose(recipe, tiny.engines, PYTORCH), threads=1)
    engine = ServedEngine(recipe, choose(recipe, tiny.engines, None), threads=1)
    try:
        np.testing.assert_allclose(baseline.infer(sample)["hidden"], engine.infer(sample)["hidden"],
                                   rtol=1e-3, atol=1e-4)
    finally:
        baseline.close()
        engine.close()
