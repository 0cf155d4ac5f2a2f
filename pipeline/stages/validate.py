"""baseline and validate: each engine against the PyTorch baseline, for accuracy and latency.

What one request is, and so what the baseline runs and how an engine is timed, belongs to
the recipe's workload (pipeline/workloads: a forward pass, or generation). These stages
are what every workload shares: `baseline` runs the workload's baseline; `validate`
measures one engine through the workload and turns the measurement into its EngineResult
(`engine_result`, the one place one is built), with the accuracy gates and the
effective-precision checks every engine gets.
"""

from __future__ import annotations

from pathlib import Path

from pipeline import backends, workloads
from pipeline.artifacts import EngineResult, Gate
from pipeline.artifacts.report import OutputAccuracy
from pipeline.backends.openers import timing_feed
from pipeline.recipe import Recipe
from pipeline.stages import Produced
from pipeline.store.recipe_folder import Artifact
from pipeline.workloads.base import FieldValues


def baseline(recipe: Recipe, workdir: Path) -> Produced:
    return Produced(*workloads.of(recipe).baseline(recipe, workdir))


def validate(recipe: Recipe, target, engine: Artifact, base: Artifact, workdir: Path) -> Produced:
    """The engine's EngineResult (validate-<target>.json once committed) and the files the
    workload wrote beside it."""
    measured = workloads.of(recipe).measure(recipe, target, engine, base, workdir)
    result = engine_result(recipe, target, engine, measured, workdir)
    return Produced(measured.files, {"passed": all(g.passed for g in result.gates)},
                    {f"validate-{target.id}.json": result})


def engine_result(recipe: Recipe, target, engine: Artifact, measured: workloads.Measured,
                  workdir: Path) -> EngineResult:
    """The one EngineResult builder: what identifies the engine, what the workload measured,
    and the gates (accuracy, the workload's own, effective precision)."""
    head = {"target": target.id, "kind": target.kind, "path": str(engine.path),
            "sha256": engine.sha256, "bytes": engine.bytes}
    if measured.skipped:
        return EngineResult(**head, status="skipped", reason=measured.skipped)
    fields = measured.measurement.fields()  # typed: validated where they were measured
    gate_list = gates(recipe, measured.measurement.accuracy) + list(measured.gates)
    fields.update(precision_checks(recipe, target, engine, workdir, gate_list))
    fields["roofline"] = roofline_check(recipe, target, engine, fields)
    return EngineResult.model_validate({**head, "status": "built", "reason": None,
                                        "precision": recipe.precision.mode, **fields,
                                        "gates": gate_list})


def gates(recipe: Recipe, accuracy: dict[str, OutputAccuracy]) -> list[Gate]:
    tol = recipe.validate_.tolerance
    out = []
    for name, m in accuracy.items():
        out.append(_gate(f"{name}.cosine", m.cosine >= tol.cosine_min,
                         f"{m.cosine:.6f} >= {tol.cosine_min:g}"))
        if tol.max_abs is not None:
            out.append(_gate(f"{name}.max_abs", m.max_abs <= tol.max_abs,
                             f"{m.max_abs:.3g} <= {tol.max_abs:g}"))
        if tol.top1_min is not None and name in recipe.top1_outputs():
            agree = m.top1_agreement  # None: no class axis to take an argmax over
            out.append(_gate(f"{name}.top1_agreement", agree is not None and agree >= tol.top1_min,
                             f"{agree:.4f} >= {tol.top1_min:g}" if agree is not None else
                             f"not measurable: `{name}` has no class axis (last dim > 1)"))
        out.append(_gate(f"{name}.finite", m.nonfinite == 0, f"{m.nonfinite} NaN/Inf elements"))
    return out


def precision_checks(recipe: Recipe, target, engine: Artifact, workdir: Path,
                     gate_list: list[Gate]) -> FieldValues:
    """Effective precision of a quantized engine that is an ONNX graph (ENGINE_IS_ONNX: ONNX
    Runtime's profiler times its kernels) and its gate; CPU caveats."""
    from pipeline.precision import EMULATED_ON_CPU

    spec, extra = recipe.precision, {}
    if spec.mode in EMULATED_ON_CPU:
        extra["latency_note"] = EMULATED_ON_CPU[spec.mode]
    if backends.get(target.kind).ENGINE_IS_ONNX and spec.mode in ("int8", "int4", "fp8"):
        from pipeline.precision import effective
        from pipeline.precision.kv_cache import CacheCodec

        feed = CacheCodec.of_graph(engine.path).feed(timing_feed(recipe))  # caches in the engine's type
        result = effective.measure(engine.path, feed, workdir, fp8=spec.mode == "fp8")
        extra["ort_flop_shares"] = result.dump()
        if spec.require_effective_precision is not None:
            gate_list.append(effective.gate(result, spec.require_effective_precision))
    return extra


def roofline_check(recipe: Recipe, target, engine: Artifact, fields: FieldValues):
    """Where the time goes against the floor (roofline/report_section.py): the workload's
    points profiled and costed on this machine's cached hardware entry; seconds, not minutes."""
    from pipeline import workloads
    from pipeline.roofline import report_section

    latency = fields.get("latency_ms")
    return report_section.check(recipe, workloads.of(recipe), target.kind, engine.path, fields.get("device"),
                                fields.get("threads") or recipe.validate_.threads, fields.get("generation"),
                                latency.p50 if latency is not None else None)


def _gate(name: str, passed: bool, detail: str) -> Gate:
    return Gate(name=name, passed=bool(passed), detail=detail)
