"""`pipeline tune`'s predictions: each candidate's roofline floor before its build, the built
graph's after it, and how the predicted gains ranked against the measured ones (the model:
pipeline/roofline/candidates.py). Advice only: the search goes on without it."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.json_object import JsonObject


class Predictions:
    """Each candidate's roofline floor on this machine's `pipeline hw` entry, predicted
    before its build from the FP32 engine's costs at the timing feed's shape
    (roofline/candidates.py), the built graph's floor after it, and how the predicted gains
    ranked against the measured ones (Spearman's rho over the timed candidates)."""

    def __init__(self, skel, cost, looked, threads: int | None):
        from pipeline.roofline import candidates

        self.skel, self.cost, self.looked, self.threads = skel, cost, looked, threads
        self.base_ms = candidates.predict(cost, skel, {}, looked.entry, threads).floor_ms

    @classmethod
    def of(cls, base_engine: Path, feed: dict, threads: int | None, progress) -> Predictions | None:
        """From the FP32 engine (an ONNX graph); None, with a note, where it cannot be costed:
        the search goes on without predictions."""
        from pipeline.hardware import database
        from pipeline.roofline import candidates, costs, shapes

        if base_engine.suffix != ".onnx":
            progress.note(f"tune: no prediction: {base_engine.name} is not an ONNX graph")
            return None
        try:
            skel = shapes.skeleton(base_engine)
            cost = costs.graph_cost(skel, candidates.feed_dims(skel, feed))
            return cls(skel, cost, database.this_machine(), threads)
        except Exception as e:  # noqa: BLE001  (a prediction is advice: never the reason a search fails)
            progress.note(f"tune: no prediction: {type(e).__name__}: {e}")
            return None

    def before(self, c) -> JsonObject:
        from pipeline.roofline import candidates

        got = candidates.predict(self.cost, self.skel, c.precision, self.looked.entry, self.threads)
        speedup = self.base_ms / got.floor_ms if got.floor_ms and self.base_ms else None
        return {"predicted_ms": got.floor_ms, "predicted_speedup": speedup, "prediction": got.method}

    def built_floor(self, engine: Path) -> float | None:
        """The built graph's own floor at the same dims: what re-pricing stood in for."""
        from pipeline.roofline import costs, model, shapes

        if engine.suffix != ".onnx":
            return None
        built = costs.graph_cost(shapes.skeleton(engine), self.cost.dims)
        return model.roofline(built, self.looked.entry, self.threads).time_s * 1e3

    def summary(self, done: list, ranked: bool) -> JsonObject:
        from pipeline.roofline import candidates

        timed = [c for c in done if c.result.get("predicted_speedup") and c.result.get("chained")]
        predicted = [c.result["predicted_speedup"] for c in timed]
        measured = [1 / c.result["chained"] for c in timed]
        e = self.looked.entry
        return {"order": "by predicted gain" if ranked else "as the grid lists them",
                "hardware": f"{e.title} ({e.provenance} {e.source.date})", "threads": self.threads,
                "dims": self.cost.dims, "fp32_floor_ms": self.base_ms,
                "rank_correlation": candidates.rank_correlation(predicted, measured),
                "compared": len(timed),
                "method": "floor = sum over nodes of max(FLOPs / peak of its type, bytes / DRAM bandwidth) on this "
                          "machine's `pipeline hw` entry, at the timing feed's shape; an unbuilt candidate: the "
                          "FP32 engine's nodes re-priced at its precision (pipeline/roofline/candidates.py); "
                          "measured gain = 1 / chained time ratio vs FP32; rank_correlation: Spearman's rho of "
                          "predicted vs measured gain"}


def gains(c: dict) -> list[str]:
    """(predicted, measured) speedup vs FP32: the roofline's before the build, 1 / chained after."""
    predicted = c.get("predicted_speedup")
    return [f"{predicted:.2f}x" if predicted else "—", f"{1 / c['chained']:.2f}x" if c.get("chained") else "—"]


def prediction_line(result: dict) -> str:
    """How the prediction fared: the order built in and the rank correlation."""
    p = result.get("prediction") or {}
    if "rank_correlation" not in p:
        return p.get("reason", "no prediction")
    rho = p["rank_correlation"]
    return (f"built {p['order']}; predicted gains (roofline floors on {p['hardware']}, at "
            f"{p['dims']}) vs measured over {p['compared']} timed candidates: Spearman's rho "
            + (f"{rho:+.2f}" if rho is not None else "undefined (fewer than 3, or all tied)"))
