"""stages/report.py: report.md's optimize section for a 30-layer KV-cache model (61 outputs
of drift in two entries)."""

from pipeline.render.report_markdown import _drift


def test_sixty_kv_cache_outputs_are_one_drift_entry():
    drift = {"logits": {"max_abs": 0.0252, "cosine": 1.0},
             **{f"present.{i}.{kv}": {"max_abs": 1e-4 * i, "cosine": 1 - 1e-8 * i}
                for i in range(30) for kv in ("key", "value")}}
    text = _drift(drift)
    assert text.startswith("`logits` max abs 2.52e-02")
    assert "60 outputs `present.*` worst max abs 2.90e-03 (`present.29.key`)" in text
    assert text.count("present.") == 3  # the family, its worst by max abs and by cosine
