"""workloads/generation_markdown.py: report.md's generation sections: decode against the bandwidth floor
for the engine and PyTorch, memory per runner (each in a process of its own)."""

from pipeline.workloads import generation_markdown as generation_report


def _floor(tpot_engine, tpot_torch):
    def side(weights, tpot):
        return {"bandwidth_gb_s": 25.7, "weights_bytes": weights,
                "points": {"b1-p128": {"context": 136, "bytes": weights, "floor_ms": weights / 25.7e6,
                                       "tpot_ms": tpot, "tpot_over_floor": tpot / (weights / 25.7e6)}}}
    return {**side(147e6, tpot_engine), "baseline": side(540e6, tpot_torch)}


def test_the_floor_is_in_the_report_for_the_engine_and_pytorch():
    lines = generation_report.floor_lines({"floor": _floor(30.0, 90.0)})
    rows = [line for line in lines if line.startswith("| engine") or line.startswith("| PyTorch")]
    assert len(rows) == 2
    assert "| 147 | 5.72 | 30.00 | 5.2x |" in rows[0] and "| 540 | 21.01 | 90.00 | 4.3x |" in rows[1]
    assert "25.7 GB/s" in lines[1]


def test_memory_names_each_runners_own_load_and_peak():
    mb = 1 << 20
    memory = {"peak": {"torch-static-cache": {"peak_rss_bytes": 1200 * mb, "growth_bytes": 6 * mb},
                       "onnxruntime-iobinding": {"peak_rss_bytes": 700 * mb, "growth_bytes": 7 * mb}},
              "load_rss_bytes": {"torch-static-cache": 540 * mb, "onnxruntime-iobinding": 545 * mb},
              "before_runner_bytes": {"torch-static-cache": 600 * mb, "onnxruntime-iobinding": 150 * mb},
              "request": "b1-p128", "kv_cache_bytes_per_token": 46080, "kv_cache_bytes_at_peak": 46080 * 144}
    text = "\n".join(generation_report.memory_lines({"memory": memory}))
    assert "each runner in a fresh process of its own" in text
    assert "torch-static-cache: load 540 MB, peak 1200 MB (+6 MB while generating)" in text
    assert "onnxruntime-iobinding: load 545 MB, peak 700 MB (+7 MB while generating)" in text
