"""Cold start: the first HTTP request `pipeline serve` sends to its own server, checked
against the same engine run in this process, and the serve-start-<engine>.json artifact.

The probe is one sample of the recipe's timing feed (row 0 at the opt shape; for a
generation engine, a short prompt and 4 greedy tokens). The check opens the engine in the
CLI's own process only after the first answer came back, so it never delays the cold start.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from pipeline.core.errors import StageFailed
from pipeline.core.json_object import JsonObject

TOLERANCE = 1e-4  # max |HTTP - in process|, relative to the output's largest magnitude
PROBE_TOKENS = 4


def probe(recipe) -> JsonObject:
    """The first request's body: one sample, as the HTTP API takes it."""
    if recipe.workload.served_as == "generate":
        high = int(recipe.inputs[0].range[1]) if recipe.inputs[0].range else 256
        prompt = [int(t) for t in np.random.default_rng(0).integers(1, min(high, 256), 8)]
        return {"prompt_ids": prompt, "max_new_tokens": PROBE_TOKENS, "stream": False}
    from pipeline.backends.openers import timing_feed

    feed = timing_feed(recipe)
    return {"inputs": {k: np.asarray(v)[:1].tolist() for k, v in feed.items()}}


def post(url: str, body: dict, timeout: float = 300, api_key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def first_request(server, recipe) -> tuple[dict, dict, float]:
    """(the probe, the answer, its round trip in ms); StageFailed when it is not a 200."""
    body = probe(recipe)
    route = recipe.workload.served_as
    start = time.perf_counter()
    status, answer = post(f"{server.url}/{route}", body, api_key=getattr(server, "api_key", None))
    elapsed = (time.perf_counter() - start) * 1e3
    if status != 200:
        raise StageFailed(f"the served engine answered the first request with HTTP {status}: "
                         f"{answer.get('error', answer)}")
    return body, answer, elapsed


def check(recipe, engines_root: Path, engine: str | None, body: dict, answer: dict,
          threads: int | None) -> str:
    """Compare the HTTP answer with the engine run here; StageFailed naming the difference."""
    from pipeline.serving.engine import ServedEngine, choose

    served = ServedEngine(recipe, choose(recipe, engines_root, engine), threads)
    try:
        if served.generation:
            from pipeline.generation.sampling import SamplingParams

            params = SamplingParams(body["max_new_tokens"], ignore_eos=True)  # as /generate does
            here = list(served.generate(body["prompt_ids"], params))
            if answer["token_ids"] != here:
                raise StageFailed(f"served tokens {answer['token_ids']} differ from the engine's in "
                                 f"process {here}")
            return "tokens equal"
        from pipeline.serving.collate import DTYPES

        feed = {s.name: np.asarray(body["inputs"][s.name], DTYPES[s.dtype]) for s in recipe.inputs}
        here = served.infer(feed)
    finally:
        served.close()
    worst = 0.0
    for name, value in here.items():
        got = np.asarray(answer["outputs"][name], dtype=np.float64)
        if got.shape != value.shape:
            raise StageFailed(f"served output `{name}` has shape {list(got.shape)}, in process "
                             f"{list(value.shape)}")
        scale = max(float(np.abs(value).max()), 1e-12)
        worst = max(worst, float(np.abs(got - value).max()) / scale)
    if not worst <= TOLERANCE:
        raise StageFailed(f"served outputs differ from the engine's in process by {worst:.3g} "
                         f"(relative; allowed {TOLERANCE:g})")
    return f"max |diff| / max |value| {worst:.2g} <= {TOLERANCE:g}"


def record(recipe, engines_root: Path, fields: dict) -> Path:
    """Write serve-start-<engine>.json into the recipe's folder (its own stage `serve:<engine>`,
    under the folder's lock, committed by run/records.py like every artifact)."""
    from pipeline.artifacts import recorded
    from pipeline.artifacts.serve_start import ServeStart
    from pipeline.core import deps
    from pipeline.run import records
    from pipeline.store.folder_names import folder_name
    from pipeline.store.recipe_folder import Store, dumps, now

    model = ServeStart.model_validate({**fields, "schema": 1, "device": deps.device(),
                                       "versions": deps.versions(), "started": fields.get("started") or now()})
    name = f"serve-start-{fields['engine']}.json"
    store = Store(engines_root, folder_name(recipe))
    text = dumps(recorded.dump(model))
    stage_id = f"serve:{fields['engine']}"
    with store.lock():
        work = store.workdir(stage_id) / name
        work.write_text(text)
        # a measurement, never a cache hit: its key names the recipe and the engine file served
        key = records.stage_key(stage_id, {"recipe_sha256": recipe.digest, "engine": fields["engine"],
                                           "sha256": fields.get("sha256")}, {})
        records.commit(store, stage_id, {name: work}, key)
    return store.dir / name
