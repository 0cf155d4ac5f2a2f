"""Serving a generation engine: tokens streamed one per line over HTTP (a real local Ray
Serve run), the same tokens as the engine generates in process, and the final line's timings."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.generation.test_run import built_gen  # noqa: F401  (the module-scoped build fixture)

pytestmark = pytest.mark.slow


def test_a_generation_engine_streams_the_tokens_it_generates_in_process(built_gen):  # noqa: F811
    pytest.importorskip("ray.serve")
    from pipeline.generation.sampling import SamplingParams
    from pipeline.serving import app
    from pipeline.serving.engine import ServedEngine, choose
    from pipeline.store.folder_names import load

    recipe = load(built_gen.built.name, (), built_gen.engines)
    prompt = [5, 17, 99, 3, 42, 7]
    engine = ServedEngine(recipe, choose(recipe, built_gen.engines, None), threads=1)
    try:
        expected = list(engine.generate(prompt, SamplingParams(5, ignore_eos=True)))
    finally:
        engine.close()
    with app.local_ray(num_cpus=2):
        server = app.start(recipe, built_gen.engines)
        body = json.dumps({"prompt_ids": prompt, "max_new_tokens": 5, "stream": True}).encode()
        request = urllib.request.Request(f"{server.url}/generate", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.headers["content-type"].startswith("application/x-ndjson")
            lines = [json.loads(line) for line in response if line.strip()]
        tokens, final = [line["token"] for line in lines[:-1]], lines[-1]
        assert tokens == expected and final["done"] and final["tokens"] == 5
        assert 0 < final["ttft_ms"] <= final["e2e_ms"] and final["tpot_ms"] > 0
        too_long = json.dumps({"prompt_ids": prompt, "max_new_tokens": 10_000}).encode()
        request = urllib.request.Request(f"{server.url}/generate", too_long, {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 400 and "context" in json.loads(refused.value.read())["error"]
        server.stop()
