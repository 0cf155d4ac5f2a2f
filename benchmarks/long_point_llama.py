"""The long point (issue 37) against llama.cpp: decode after a 5,120-token prompt, our engines
in process and llama.cpp's llama-server on the same GGUF, taking turns round by round.

    make engine RECIPE=smollm2-int4 && make engine RECIPE=smollm2-int4-kv8
    benchmarks/peers/setup.sh llama model
    .venv/bin/python benchmarks/long_point_llama.py [--rounds 6] [--out results/long-point-DATE]

The prompt: the first 5,120 tokens of data/chat's held-out text (SmolLM2's tokenizer, the
GGUF's own), the same ids for every runner; then 32 greedy new tokens. Ours: the IOBinding loop
(generation/runners.py OrtLoopRunner, 2 threads), one decode call timed per token, TPOT = the
mean of the 31 calls after the first token. llama.cpp: llama-server (-t 2 -tb 2 -np 1, a
prompt of token ids, cache_prompt off, ignore_eos), TPOT = its own `timings.predicted_per_token_ms`,
so HTTP is not in its figure. Per round every runner goes once, the order rotated. Ratios: the
median over rounds of the per-round ratio, with a 95% sign-test interval (core/stats.py).
Floors: bytes a decode step reads (weights as stored + the cache at the context) over the
measured copy bandwidth (bench/floor.py); llama.cpp's cache is fp16 (its default), its weights
the GGUF's tensor bytes. A benchmark, not a test: its timings are this machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.chat_peers import Server, rotated, start, stop  # noqa: E402  (a peer server, started and waited on)

PROMPT, NEW = 5120, 32
LLAMA_KV_BYTES = 2  # llama-server's default cache type: f16


def _ours(loop, ids: np.ndarray) -> tuple[float, np.ndarray]:
    """(TPOT ms: mean decode call after the first token, the greedy tokens)."""
    loop.new(1)
    tokens = [int(loop.prefill(ids[None])[0])]
    times = []
    for _ in range(NEW - 1):
        t0 = time.perf_counter()
        tokens.append(int(loop.step()[0]))
        times.append(time.perf_counter() - t0)
    return float(np.mean(times)) * 1e3, np.array(tokens)


def _llama(url: str, ids: np.ndarray) -> tuple[float, np.ndarray]:
    body = {"prompt": [int(i) for i in ids], "n_predict": NEW, "temperature": 0, "top_k": 1,
            "cache_prompt": False, "ignore_eos": True, "n_probs": 0, "return_tokens": True}
    request = urllib.request.Request(f"{url}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        reply = json.loads(response.read())
    return float(reply["timings"]["predicted_per_token_ms"]), np.array(reply.get("tokens") or [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--engines", type=Path, default=ROOT / "engines")
    parser.add_argument("--engine", action="append", default=[], metavar="LABEL=FOLDER",
                        help="our engines (default: kv-float32=smollm2-int4 kv-int8=smollm2-int4-kv8)")
    parser.add_argument("--peers-dir", type=Path, default=Path(os.environ.get("PEERS_DIR", "/work/peers")))
    parser.add_argument("--port", type=int, default=8131)
    parser.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    args = parser.parse_args()

    from pipeline.bench import floor
    from pipeline.core import stats
    from pipeline.generation import chat, runners
    from pipeline.generation import figures as gm
    from pipeline.recipe.loader import load
    from pipeline.recipe.workload import decoder_shape

    names = dict(e.split("=", 1) for e in args.engine) or {"kv-float32": "smollm2-int4", "kv-int8": "smollm2-int4-kv8"}
    recipe = load(str(ROOT / "recipes" / "smollm2-int4.yaml"))
    shape = decoder_shape(recipe.model)
    ids = chat.text_ids(chat.chat_tokenizer(recipe), recipe.workload.chat.text, PROMPT, shape.vocab)[:PROMPT]
    gguf = args.peers_dir / "SmolLM2-135M-Instruct.Q4_1.gguf"
    engines = {k: args.engines / n / "onnxruntime.onnx" for k, n in names.items()}
    loops = {k: runners.OrtLoopRunner(p, None, 2) for k, p in engines.items()}
    server = Server("llama.cpp", args.port, "smollm2",
                    [str(args.peers_dir / "llama-server"), "-m", str(gguf), "--alias", "smollm2", "--host", "127.0.0.1",
                     "--port", str(args.port), "-t", "2", "-tb", "2", "-np", "1", "-c", str(PROMPT + NEW + 64)])
    start(server, Path(tempfile.mkdtemp(prefix="long-point-")), timeout=120)
    url = f"http://127.0.0.1:{args.port}"
    runs = {**{k: (lambda loop=loop: _ours(loop, ids)) for k, loop in loops.items()},
            "llama.cpp": lambda: _llama(url, ids)}
    load_before = [round(x, 2) for x in os.getloadavg()]
    tpot: dict[str, list[float]] = {k: [] for k in runs}
    tokens: dict[str, np.ndarray] = {}
    try:
        for name, run in runs.items():  # warm-up: one generation each, untimed
            tokens[name] = run()[1]
        for r in range(args.rounds):
            for name in rotated(list(runs), r):
                tpot[name].append(runs[name]()[0])
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.2f} ms" for k, v in tpot.items()), flush=True)
    finally:
        stop(server)
    bw = floor.bandwidth()
    context = PROMPT + NEW // 2
    rows = {}
    for name in runs:
        if name == "llama.cpp":
            weights, per_token = gguf.stat().st_size, gm.kv_bytes_per_token(shape.layers, shape.kv_heads, shape.head_dim, LLAMA_KV_BYTES)
        else:
            weights = floor.weight_bytes(engines[name]).total
            per_token = gm.kv_bytes_per_token(shape.layers, shape.kv_heads, shape.head_dim, loops[name].cache_dtype.itemsize)
        floor_ms = (weights + per_token * context) / bw.bytes_per_s * 1e3
        median = float(np.median(tpot[name]))
        rows[name] = {"tpot_ms_rounds": tpot[name], "tpot_ms_median": median, "floor_ms": floor_ms,
                      "tpot_over_floor": median / floor_ms, "weights_mb": weights / 1e6, "kv_bytes_per_token": per_token,
                      "vs_llama_cpp": stats.time_ratio(np.array(tpot["llama.cpp"])[:, None], np.array(tpot[name])[:, None],
                                                      noise=0.02).dump()
                      if name != "llama.cpp" else None,
                      "tokens_equal_llama_cpp": int(np.sum(tokens[name][:NEW] == tokens["llama.cpp"][:NEW]))
                      if len(tokens["llama.cpp"]) else None}
    result = {"written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "load_average": {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]},
              "bandwidth_gb_s": bw.bytes_per_s / 1e9, "bandwidth_method": bw.method, "engines": names,
              "prompt": PROMPT, "new_tokens": NEW, "rounds": args.rounds, "runners": rows}
    table = ["| runner | KV bytes/token | TPOT median ms (rounds) | vs llama.cpp [95% CI] | floor ms | TPOT / floor "
             "| greedy tokens = llama.cpp's |", "|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        ratio = row["vs_llama_cpp"]
        versus = f"{ratio['time_ratio']:.2f}x [{ratio['ci95'][0]:.2f}, {ratio['ci95'][1]:.2f}]" if ratio else "-"
        table.append(f"| {name} | {row['kv_bytes_per_token']:,} | {row['tpot_ms_median']:.2f} "
                     f"({', '.join(f'{t:.1f}' for t in row['tpot_ms_rounds'])}) | {versus} | {row['floor_ms']:.2f} "
                     f"| {row['tpot_over_floor']:.2f} | {row['tokens_equal_llama_cpp']}/{NEW} |")
    print("\n".join(table))
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=float) + "\n")
        args.out.with_suffix(".md").write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
