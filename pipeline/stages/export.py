"""export: PyTorch model -> model.onnx, with dynamic dims from the recipe and a parity check.

The check runs the exported graph in ONNX Runtime (no graph optimization, so it judges the
export alone) on feeds at the profile's opt and max points, the max point proving that the
dynamic axes really are dynamic, and compares against PyTorch on the same feeds.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
import warnings
from pathlib import Path

from pipeline import data, metrics, models
from pipeline.errors import PipelineError, RecipeError, StageFailed
from pipeline.recipe import Dim, Recipe
from pipeline.text import first_line

NAME, VERSION = "export", 1
SECTIONS = ("model", "inputs", "outputs", "export", "data")


def _dim_symbols(recipe: Recipe) -> dict[tuple[str, int], tuple[str, Dim]]:
    """(input, axis) -> (symbol, Dim) for every dynamic axis; shared names share symbols."""
    out = {}
    for spec in recipe.inputs:
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, Dim):
                out[(spec.name, axis)] = (dim.name or f"{spec.name}_{axis}", dim)
    return out


def dynamic_shapes(recipe: Recipe):
    """torch.export Dims, one object per symbol (positional, in forward() order)."""
    import torch

    dims: dict[str, torch.export.Dim] = {}
    per_input = []
    symbols = _dim_symbols(recipe)
    for spec in recipe.inputs:
        axes = {}
        for axis in range(len(spec.shape)):
            if (spec.name, axis) in symbols:
                symbol, dim = symbols[(spec.name, axis)]
                if symbol not in dims:
                    dims[symbol] = torch.export.Dim(symbol, min=dim.min, max=dim.max)
                axes[axis] = dims[symbol]
        per_input.append(axes or None)
    return tuple(per_input)


def _dynamic_axes(recipe: Recipe) -> dict[str, dict[int, str]]:
    """TorchScript exporter's form: input -> {axis: symbol}."""
    axes: dict[str, dict[int, str]] = {}
    for (name, axis), (symbol, _) in _dim_symbols(recipe).items():
        axes.setdefault(name, {})[axis] = symbol
    return axes


@contextlib.contextmanager
def _quiet_torch_logs(verbose: bool):
    if verbose:
        yield
        return
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def enabled(recipe: Recipe) -> bool:
    return True


def run(recipe: Recipe, graph, workdir: Path, verbose: bool = False) -> tuple[dict[str, Path], dict]:
    """The first graph stage: `graph` is None (there is none before export)."""
    if recipe.workload.kind == "generation":  # a KV-cache graph (pipeline/generation/export.py)
        from pipeline.generation import export as kv_export

        return kv_export.run(recipe, workdir, verbose)
    import onnx
    import torch

    model = models.load(recipe)
    example = data.feeds(recipe, "export")[0]
    args = tuple(torch.from_numpy(example[i.name]) for i in recipe.inputs)
    _check_outputs(recipe, model, args)
    out_path = workdir / "model.onnx"
    kwargs = dict(
        input_names=[i.name for i in recipe.inputs],
        output_names=recipe.outputs,
        opset_version=recipe.export.opset,
    )
    if recipe.export.exporter == "dynamo":
        kwargs.update(dynamo=True, dynamic_shapes=dynamic_shapes(recipe), external_data=False)
    else:
        kwargs.update(dynamo=False, dynamic_axes=_dynamic_axes(recipe))

    log = io.StringIO()
    t0 = time.perf_counter()
    try:
        # The exporters print progress to stdout and warnings to stderr; keep them for -v.
        with contextlib.redirect_stdout(log), _quiet_torch_logs(verbose), torch.no_grad():
            torch.onnx.export(model, args, str(out_path), **kwargs)
    except Exception as e:
        raise StageFailed(
            f"export ({recipe.export.exporter}) failed: {first_line(e, with_type=True)}",
            "rerun with --debug for the trace, or try export.exporter: torchscript",
        ) from e
    seconds = time.perf_counter() - t0
    if verbose:
        print(log.getvalue())

    try:
        proto = onnx.load(str(out_path), load_external_data=False)
        onnx.checker.check_model(proto)
    except Exception as e:  # the exporter wrote a graph ONNX itself rejects
        raise StageFailed(f"export ({recipe.export.exporter}) wrote an invalid ONNX graph: "
                          f"{first_line(e, with_type=True)}", "try export.exporter: torchscript") from e
    try:
        parity = check_parity(recipe, model, out_path)
    except PipelineError:
        raise
    except Exception as e:  # e.g. out of memory at the max shape
        raise StageFailed(
            f"export parity check failed to run the graph at the opt/max shapes: {first_line(e, with_type=True)}",
            "lower the inputs' max dims if memory ran out") from e
    return {"model.onnx": out_path}, {
        "exporter": recipe.export.exporter,
        "opset": next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None),
        "nodes": len(proto.graph.node),
        "export_seconds": seconds,
        "parity": parity,
    }


def _check_outputs(recipe: Recipe, model, args: tuple) -> None:
    """One eager forward before the (slow) export: the model runs on the recipe's inputs and
    returns exactly one tensor per name in `outputs`."""
    import torch

    try:
        with torch.no_grad():
            out = model(*args)
    except Exception as e:
        # Before any export work, so the recipe's `inputs` (or the model) is the cause: a user error.
        raise RecipeError(f"{recipe.where}: inputs: the model fails on a feed of the recipe's inputs "
                          f"({first_line(e, with_type=True)})",
                          "check the inputs' dtype, shape and range against forward()") from e
    count = 1 if isinstance(out, torch.Tensor) else len(out) if isinstance(out, (tuple, list, dict)) else 0
    if count != len(recipe.outputs):
        raise RecipeError(f"{recipe.where}: outputs: the model returns {count} output(s), the recipe names "
                          f"{len(recipe.outputs)} ({', '.join(recipe.outputs)})",
                          "give one name per output, in order")


def check_parity(recipe: Recipe, model, onnx_path: Path) -> dict:
    """Exported graph vs PyTorch at the opt and max profile points; StageFailed if off."""
    import numpy as np

    from pipeline.backends.torch import TorchRunner
    from pipeline.passes import check

    rng = np.random.default_rng([recipe.data.seed, 99])
    feeds = [data.random_feed(recipe.inputs, p, rng) for p in ("opt", "max")]
    onnx_out = check.run(str(onnx_path), feeds, recipe.outputs)  # unoptimized: the export alone
    with TorchRunner(model, [i.name for i in recipe.inputs], recipe.outputs) as runner:
        torch_out = [runner.infer(f, check_inputs=False) for f in feeds]
    result = metrics.compare(torch_out, onnx_out, top1_outputs=[])
    spec = recipe.export.parity
    for name, m in result.items():
        if not (m["max_abs"] <= spec.max_abs and m["cosine"] >= spec.cosine_min):
            raise StageFailed(
                f"export parity: output `{name}` differs from PyTorch: max_abs {m['max_abs']:.3g} "
                f"(allowed {spec.max_abs:g}), cosine {m['cosine']:.6f} (allowed >= {spec.cosine_min:g})",
                "the exporter changed the model's numerics; try export.exporter: torchscript",
            )
    return {name: {"max_abs": m["max_abs"], "cosine": m["cosine"]} for name, m in result.items()}
