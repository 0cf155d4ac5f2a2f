"""Serving MiniLM: fp32 (`minilm`) vs INT8 (`minilm-int8`) as Ray Serve services.

1. Cold start and memory: `pipeline serve R --check-only` as a real subprocess, the two
   recipes interleaved (ABBA order per round pair), each run writing serve-start-*.json:
   command start -> Ray up -> replica loaded -> first correct HTTP answer, and the
   replica's resident memory at load and at its peak.
2. Same embeddings over HTTP: one served session per recipe; the held-out sentences
   (benchmarks/data/minilm_heldout.txt, tokenized alone at their real lengths) sent over
   HTTP 16 at a time, so the batcher pads and batches them; each answer compared with the
   same engine run in this process on that sentence alone (max |diff|, min cosine), and
   the batch sizes the server reports.

    python benchmarks/serve_minilm.py [--rounds 4] [--recipes minilm minilm-int8]
                                      [--only equal|cold] [--out benchmarks/results/serve-minilm]
Needs `pipeline run minilm` and `pipeline run minilm-int8` first (engines/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent
RECIPES = ("minilm", "minilm-int8")
FIELDS = ("ray_start_s", "ready_s", "cold_start_s", "first_request_ms")
REPLICA = ("load_s", "rss_at_load_mb", "peak_rss_mb")


def cold_starts(rounds: int, engines: Path, recipes: tuple[str, ...]) -> dict[str, list[dict]]:
    from pipeline.serving.app import free_port

    runs: dict[str, list[dict]] = {r: [] for r in recipes}
    for i in range(rounds):
        for name in (recipes if i % 2 == 0 else recipes[::-1]):
            cmd = [sys.executable, "-m", "pipeline", "serve", name, "--check-only", "--num-cpus", "2",
                   "--port", str(free_port()), "--engines-dir", str(engines)]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
            if proc.returncode:
                raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
            record = json.loads((engines / name / "serve-start-onnxruntime.json").read_text())
            runs[name].append({**{k: record[k] for k in FIELDS},
                               **{k: record["replica"][0][k] for k in REPLICA}, "checked": record["checked"]})
            print(name, runs[name][-1], flush=True)
    return runs


def sentences() -> list[dict[str, np.ndarray]]:
    from minilm_sentences import _tokenizer, heldout_sentences

    tok = _tokenizer()
    feeds = []
    for s in heldout_sentences():
        enc = tok(s, return_tensors="np", truncation=True, max_length=128)
        feeds.append({k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask")})
    return feeds


def same_embeddings(name: str, engines: Path, feeds: list[dict]) -> dict:
    from pipeline.serving import app
    from pipeline.serving.coldstart import post
    from pipeline.serving.engine import ServedEngine, choose
    from pipeline.store.folder_names import load

    recipe = load(name, (), engines)
    with app.local_ray(num_cpus=2):
        server = app.start(recipe, engines)
        bodies = [{"inputs": {k: v.tolist() for k, v in f.items()}} for f in feeds]
        start = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda b: post(f"{server.url}/infer", b), bodies))
        seconds = time.perf_counter() - start
        server.stop()
    assert all(status == 200 for status, _ in answers), [a for a in answers if a[0] != 200][:2]
    engine = ServedEngine(recipe, choose(recipe, engines, None), threads=2)
    diffs, cosines, sizes = [], [], {}
    try:
        for feed, (_, answer) in zip(feeds, answers):
            alone = engine.infer(feed)["sentence_embedding"][0].astype(np.float64)
            served = np.asarray(answer["outputs"]["sentence_embedding"][0], np.float64)
            diffs.append(float(np.abs(served - alone).max()))
            cosines.append(float(served @ alone / (np.linalg.norm(served) * np.linalg.norm(alone))))
            sizes[answer["batch_size"]] = sizes.get(answer["batch_size"], 0) + 1
    finally:
        engine.close()
    return {"sentences": len(feeds), "max_abs_diff": max(diffs), "median_abs_diff": statistics.median(diffs),
            "min_cosine": min(cosines), "requests_by_batch_size": dict(sorted(sizes.items())),
            "lengths": {"min": min(f["input_ids"].shape[1] for f in feeds),
                        "max": max(f["input_ids"].shape[1] for f in feeds)},
            "seconds": seconds, "tolerance_cosine_min": recipe.validate_.tolerance.cosine_min}


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def render(runs: dict, equal: dict) -> str:
    n = min((len(v) for v in runs.values()), default=0)
    lines = ["# Serving MiniLM: cold start, memory, same embeddings over HTTP", "",
             "Cold start (`pipeline serve R --check-only`, local Ray on 2 CPUs, 1 replica), "
             f"{n} interleaved runs each: median [min, max].", "",
             "| recipe | Ray up s | replica loaded s | first correct answer s | replica load s | "
             "RSS at load MiB | peak RSS MiB |", "|---|---|---|---|---|---|---|"]
    for name, rows in runs.items():
        cols = [summary([r[k] for r in rows]) for k in ("ray_start_s", "ready_s", "cold_start_s", *REPLICA)]
        lines.append(f"| {name} | " + " | ".join(cols) + " |")
    lines += ["", "Same embeddings over HTTP (held-out sentences at real lengths, 16 in flight, "
              "batched and padded by the server; each compared with the engine in process on "
              "the sentence alone):", "",
              "| recipe | sentences | lengths | max abs diff | min cosine | recipe cosine_min | "
              "requests by batch size |", "|---|---|---|---|---|---|---|"]
    for name, e in equal.items():
        lines.append(f"| {name} | {e['sentences']} | {e['lengths']['min']}..{e['lengths']['max']} | "
                     f"{e['max_abs_diff']:.2e} | {e['min_cosine']:.6f} | {e['tolerance_cosine_min']} | "
                     f"{e['requests_by_batch_size']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES))
    parser.add_argument("--only", choices=["equal", "cold"], default=None,
                        help="Run one part; results merge into --out's JSON.")
    parser.add_argument("--engines", type=Path, default=ROOT / "engines")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "serve-minilm")
    args = parser.parse_args()
    from pipeline.core import deps

    path = args.out.with_suffix(".json")
    result = json.loads(path.read_text()) if path.is_file() else {"cold_start": {}, "same_embeddings": {}}
    if args.only in (None, "equal"):
        feeds = sentences()
        for name in args.recipes:
            result["same_embeddings"][name] = same_embeddings(name, args.engines, feeds)
            print(name, json.dumps(result["same_embeddings"][name]), flush=True)
    if args.only in (None, "cold"):
        result["cold_start"].update(cold_starts(args.rounds, args.engines, tuple(args.recipes)))
    result.update(device=deps.device(), versions=deps.versions())
    path.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(render(result["cold_start"], result["same_embeddings"]))
    print(render(result["cold_start"], result["same_embeddings"]))


if __name__ == "__main__":
    main()
