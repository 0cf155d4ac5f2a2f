"""A compacted engine against its plain form (issue 37, lean engine files), in one process.

    make engine RECIPE=smollm2-int4
    PYTHONPATH=. .venv/bin/python benchmarks/compact_storage.py [--engine engines/smollm2-int4/onnxruntime.onnx]
        [--rounds 20] [--out benchmarks/results/compact-storage-DATE]

The build stores a generation engine's constants in their smallest exact form
(pipeline/model/compact_storage.py); this writes the same engine's plain form (every form
folded back, as a session holds it) beside it and compares the two: file size; the outputs
(logits and presents) of a 16-token prefill and of a decode step over 128 cached tokens, bit
for bit; session load time (median of 5 each, alternating); and the decode step's time at
2 threads, ONNX Runtime's default optimization level (the runners' and serving's), the two
sessions taking turns block by block (ABAB), with the paired ratio's 95% interval
(core/stats.paired_ratio). A benchmark, not a test: its timings are this machine's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    t0 = time.perf_counter()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session, time.perf_counter() - t0


def _feed(session, new: int, past: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([new, past])
    feed = {"input_ids": rng.integers(0, 49152, (1, new)).astype(np.int64),
            "attention_mask": np.ones((1, past + new), np.int64)}
    for i in session.get_inputs():
        if i.name.startswith("past"):  # [batch, kv heads, past, head dim]
            feed[i.name] = (rng.standard_normal((1, i.shape[1], past, i.shape[3])) * 0.1).astype(np.float32)
    return {k: v for k, v in feed.items() if k in {i.name for i in session.get_inputs()}}


def main() -> None:
    import onnx

    from pipeline.core import stats
    from pipeline.model import compact_storage

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, default=ROOT / "engines/smollm2-int4/onnxruntime.onnx")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20, help="decode steps per block")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    compact = args.engine
    model = onnx.load(str(compact))
    stored = json.loads(next(p.value for p in model.metadata_props if p.key == compact_storage.MARK))
    compact_storage.expand(model)
    plain = compact.with_name("plain-" + compact.name)
    onnx.save(model, str(plain))
    del model
    try:
        sizes = {"compact": compact.stat().st_size, "plain": plain.stat().st_size}
        loads: dict[str, list[float]] = {"compact": [], "plain": []}
        for _ in range(5):
            for name, path in (("compact", compact), ("plain", plain)):
                loads[name].append(_session(path)[1])
        a, _ = _session(plain)
        b, _ = _session(compact)
        identical = {}
        for label, new, past in (("prefill 16", 16, 0), ("decode over 128", 1, 128)):
            feed = _feed(a, new, past)
            identical[label] = all(np.array_equal(x, y) for x, y in zip(a.run(None, feed), b.run(None, feed)))
        feed = _feed(a, 1, 128)
        for s in (a, b):
            for _ in range(10):
                s.run(None, feed)
        blocks = {"plain": [], "compact": []}
        for r in range(args.rounds):
            order = (("plain", a), ("compact", b)) if r % 2 == 0 else (("compact", b), ("plain", a))
            for name, s in order:
                times = []
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    s.run(None, feed)
                    times.append((time.perf_counter() - t0) * 1e3)
                blocks[name].append(times)
        ratio, lo, hi = stats.paired_ratio(np.array(blocks["compact"]), np.array(blocks["plain"]))
    finally:
        plain.unlink(missing_ok=True)
    result = {
        "engine": str(compact.relative_to(ROOT) if compact.is_relative_to(ROOT) else compact),
        "stored": stored, "bytes": sizes, "identical_outputs": identical,
        "load_s_median": {k: float(np.median(v)) for k, v in loads.items()},
        "decode_step_ms_p50": {k: float(np.median(v)) for k, v in blocks.items()},
        "compact_over_plain": {"ratio": ratio, "ci95": [lo, hi]},
        "method": f"{args.rounds} rounds x {args.steps} decode steps (1 token over 128 cached) per "
                  "session, ABAB, 2 threads, ORT default optimization; paired ratio of the rounds' "
                  "medians with a sign-test 95% interval",
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.with_suffix(".json").write_text(text + "\n")


if __name__ == "__main__":
    main()
