"""precision: the FP32 graph -> typed.onnx with its precision in the graph (pipeline/precision).

Runs only when the recipe asks for a precision other than fp32. After the mode's own work
the typed graph is checked against its input graph on calibration-split feeds (parity: it
must stay finite; its cosine and top-1 agreement go into the report, the gates judge the
engine against PyTorch later).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline import data
from pipeline.core.errors import PipelineError, StageFailed
from pipeline.core.json_object import JsonObject
from pipeline.core.text import first_line
from pipeline.recipe import Recipe
from pipeline.stages import Produced

NAME = "precision"
SECTIONS = ("precision", "data", "inputs", "outputs")


def enabled(recipe: Recipe) -> bool:
    return recipe.precision.mode != "fp32"


def preflight(recipe: Recipe) -> None:
    """Before any stage runs: calibration data loads and fits the recipe's inputs."""
    p = recipe.precision
    if enabled(recipe) and (p.needs_calibration or p.sensitivity.enabled):
        data.calibration_feeds(recipe)


def spec(recipe: Recipe) -> JsonObject:
    """The cache key's recipe part: the calibration data (not the validation split), and a
    calibration file by its content."""
    key = recipe.section("precision", "inputs", "outputs")
    data_spec = recipe.section("data")["data"]
    key["calibration"] = {"seed": data_spec["seed"], "calibration": data_spec["calibration"]}
    key["calibration_files"] = data.key(recipe, "calibration")
    if recipe.precision.int4_source == "checkpoint":  # the blocks come from the file's content
        import hashlib

        from pipeline.precision.int4 import checkpoint_file

        with open(checkpoint_file(recipe), "rb") as f:
            key["checkpoint_sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
    if recipe.precision.mode == "int8" and recipe.precision.weight_range == "auto":
        from pipeline.precision import isa

        key["reduced_weight_range"] = isa.needs_reduced_range()  # the graph depends on the CPU
    return key


def summary(meta: dict) -> None:
    """Nothing to add to the stage's line (report.md holds what it did)."""


def run(recipe: Recipe, graph, workdir: Path, verbose: bool = False) -> Produced:
    from pipeline import precision
    from pipeline.precision import evaluate

    workdir = workdir.resolve()  # ORT's tools run with the workdir as CWD
    try:
        out, meta = precision.apply(recipe, graph.path.resolve(), workdir, verbose)
    except PipelineError:
        shutil.rmtree(workdir, ignore_errors=True)  # a user error leaves nothing behind
        raise
    # Parity of the typed graph with its FP32 input (calibration feeds, not validation ones).
    feeds = (data.calibration_feeds(recipe) or data.feeds(recipe, "export"))[:2]
    fp8 = recipe.precision.mode == "fp8"
    try:
        reference = evaluate.run(graph.path, feeds, recipe.outputs)
        typed = evaluate.run(out, feeds, recipe.outputs, fp8)
    except Exception as e:  # e.g. no CPU kernel for bf16
        parity = {"error": first_line(e, with_type=True)}
    else:
        measured = evaluate.compare(reference, typed, recipe.top1_outputs())
        if measured.nonfinite:
            raise StageFailed(
                f"precision {recipe.precision.mode}: the typed graph produces {measured.nonfinite} "
                "NaN/Inf values", "keep more op types in FP32 (precision.block_list / exclude)")
        parity = measured.dump()
        if recipe.workload.kv_cache:  # the feeds' caches are drawn, not computed
            parity["caveat"] = ("KV-cache inputs of these feeds are random N(0,1) values, not caches a "
                                "prompt produces: a low figure here says little; the validate stage's "
                                "teacher-forced logits and task score are the measure")
    for leftover in workdir.iterdir():  # keep only the typed graph
        if leftover != out:
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    return Produced({"typed.onnx": out}, {
        "mode": recipe.precision.mode, **meta,
        "parity_vs_fp32_graph": parity,
        "cpu_latency_meaningful": recipe.precision.mode not in precision.EMULATED_ON_CPU,
    })
