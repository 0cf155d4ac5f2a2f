"""stages/report.py: report.md's optimize section for a 30-layer KV-cache model (61 outputs
of drift in two entries); the baseline drift warning compares figures of one kind only."""

from pipeline.render.report_markdown import _drift


def test_sixty_kv_cache_outputs_are_one_drift_entry():
    drift = {"logits": {"max_abs": 0.0252, "cosine": 1.0},
             **{f"present.{i}.{kv}": {"max_abs": 1e-4 * i, "cosine": 1 - 1e-8 * i}
                for i in range(30) for kv in ("key", "value")}}
    text = _drift(drift)
    assert text.startswith("`logits` max abs 2.52e-02")
    assert "60 outputs `present.*` worst max abs 2.90e-03 (`present.29.key`)" in text
    assert text.count("present.") == 3  # the family, its worst by max abs and by cosine


# ------------------------------------------------------------------- baseline drift
def _latency(p50: float, n: int):
    from pipeline.artifacts.report import LatencySummary

    return LatencySummary(p50=p50, p90=p50, p99=p50, mean=p50, std=0.0, cov=0.0, n=n)


def _generation_engine(interleaved_p50: float):
    """A built generation engine as the report stage holds it: its latency figures are decode
    steps at batch 1 (the generation section says so by being there)."""
    from pipeline.artifacts.generation import Generation
    from pipeline.artifacts.report import EngineResult

    return EngineResult.model_construct(
        target="onnxruntime", status="built", warnings=[], versus=[],
        baseline_latency_ms=_latency(interleaved_p50, 90), generation=Generation.model_construct())


def test_a_request_is_never_compared_with_a_decode_step():
    """20x apart, but one is a request (the forward baseline) and the other a decode step:
    figures of two kinds, so no drift warning."""
    from pipeline.artifacts.report import Baseline
    from pipeline.stages.report import warnings

    request_alone = Baseline.model_construct(latency_ms=_latency(898.0, 40))
    assert request_alone.timed == "request" and _generation_engine(44.9).timed == "decode step"
    assert warnings(request_alone, [_generation_engine(44.9)]) == []


def test_a_generation_baseline_alone_is_a_decode_step_and_drift_is_named_so():
    """The generation baseline stage times the same decode step at batch 1 (one generation
    alone) that validate times interleaved: 20x apart is the machine, and the warning says the
    figures are per decode step."""
    from pipeline.artifacts.generation import BaselineGeneration
    from pipeline.artifacts.report import Baseline
    from pipeline.stages.report import warnings

    alone = Baseline.model_construct(latency_ms=_latency(898.0, 15),
                                     generation=BaselineGeneration.model_construct())
    assert alone.timed == "decode step"
    (drift,) = warnings(alone, [_generation_engine(44.9)])
    assert "p50 44.900 ms per decode step interleaved" in drift and "898.000 ms timed alone" in drift
    assert warnings(alone, [_generation_engine(500.0)]) == []  # within BASELINE_DRIFT


def test_report_md_names_what_the_baseline_stage_timed():
    """report.md's baseline line counts decode steps for a generation recipe (the figure is a
    decode step at batch 1), requests for every other recipe."""
    from pipeline.render.report_markdown import _summary

    class NoHeadlines:
        def headlines(self, report):
            return []

    def baseline_line(generation) -> str:
        report = {"recipe": "r", "created": "2026-12-05", "recipe_sha256": "0" * 64, "versions": {},
                  "device": {"kind": "cpu"}, "engines": [],
                  "baseline": {"runner": "torch", "precision": "fp32", "generation": generation,
                               "latency_ms": _latency(63.5, 15).model_dump()}}
        return next(line for line in _summary(report, NoHeadlines()) if line.startswith("Baseline:"))

    assert "over 15 decode steps." in baseline_line({"points": {}})
    assert "over 15 requests." in baseline_line(None)
