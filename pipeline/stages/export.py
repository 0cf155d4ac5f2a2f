"""export: PyTorch model -> model.onnx, with dynamic dims from the recipe and a parity check.

The check runs the exported graph in ONNX Runtime (no graph optimization, so it judges the
export alone) on feeds at the profile's opt and max points, the max point proving that the
dynamic axes really are dynamic, and compares against PyTorch on the same feeds.

The exported file is byte-reproducible across checkouts: the dynamo exporter writes each
node's Python stack trace (`pkg.torch.onnx.stack_trace`) with absolute file names, which
would make two checkouts of one recipe differ and leak local paths into CI artifacts; they
are rewritten relative to the import path they were found on (`pipeline/zoo/glm.py`).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import time
from pathlib import Path

from pipeline import data
from pipeline.core.errors import PipelineError, RecipeError, StageFailed
from pipeline.core.json_object import JsonObject
from pipeline.core.logs import quiet_torch_onnx
from pipeline.core.text import first_line
from pipeline.metrics import accuracy as metrics
from pipeline.model import sources as models
from pipeline.model.shapes import dynamic_axes, dynamic_shapes
from pipeline.recipe import Recipe
from pipeline.stages import Produced

NAME = "export"
SECTIONS = ("model", "inputs", "outputs", "export")


def spec(recipe: Recipe) -> JsonObject:
    """The cache key's recipe part: of the data section only the seed (the example and parity
    feeds are random), so recipes that differ in their validation or calibration data share
    one export (the stage cache copies it from a folder that recorded the same key)."""
    return {**recipe.section(*SECTIONS), "data_seed": recipe.data.seed,
            "workload_kind": recipe.workload.kind}


def enabled(recipe: Recipe) -> bool:
    return True


def preflight(recipe: Recipe) -> None:
    """No user error of its own to find early: the model source is checked by models.check."""


def summary(meta: dict) -> None:
    """Nothing to add to the stage's line."""


def run(recipe: Recipe, graph, workdir: Path, verbose: bool = False) -> Produced:
    """The first graph stage: `graph` is None (there is none before export)."""
    if recipe.workload.kv_cache:
        return _kv_cache_export(recipe, workdir, verbose)
    import torch

    model = models.load(recipe)
    example = data.feeds(recipe, "export")[0]
    args = tuple(torch.from_numpy(example[i.name]) for i in recipe.inputs)
    _check_outputs(recipe, model, args)
    out_path = workdir / "model.onnx"
    model, kwargs = _exporter_arguments(recipe, model)
    seconds = _export(recipe, model, args, out_path, kwargs, verbose)
    proto = _load_checked(recipe, out_path)
    parity = _parity(recipe, out_path)
    return Produced({"model.onnx": out_path}, {
        "exporter": recipe.export.exporter,
        "opset": next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None),
        "nodes": len(proto.graph.node),
        "export_seconds": seconds,
        "parity": {name: d.dump() for name, d in parity.items()},
    })


def _kv_cache_export(recipe: Recipe, workdir: Path, verbose: bool) -> Produced:
    """A KV-cache graph (pipeline/generation/export.py), its source paths made portable too."""
    import onnx

    from pipeline.generation import export as kv_export

    files, meta = kv_export.run(recipe, workdir, verbose)
    proto = onnx.load(str(files["model.onnx"]))
    if portable_paths(proto):
        onnx.save(proto, str(files["model.onnx"]))
    return Produced(files, meta)


def _other_exporter(recipe: Recipe) -> str:
    """The exporter a failure message suggests trying instead."""
    return "dynamo" if recipe.export.exporter == "torchscript" else "torchscript"


def _exporter_arguments(recipe: Recipe, model) -> tuple:
    """The model to export (wrapped for torchscript) and torch.onnx.export's keyword arguments."""
    kwargs = dict(
        input_names=[i.name for i in recipe.inputs],
        output_names=recipe.outputs,
        opset_version=recipe.export.opset,
    )
    if recipe.export.exporter == "dynamo":
        kwargs.update(dynamo=True, dynamic_shapes=dynamic_shapes(recipe), external_data=False)
    else:
        kwargs.update(dynamo=False, dynamic_axes=dynamic_axes(recipe))
        # Inputs by name: transformers 5 models traced with positional inputs fail
        # ("forward() got multiple values for argument 'use_cache'").
        model = ByName(model, kwargs["input_names"])
    return model, kwargs


def _export(recipe: Recipe, model, args: tuple, out_path: Path, kwargs: dict, verbose: bool) -> float:
    """torch.onnx.export to `out_path`; returns its seconds. StageFailed with the root cause."""
    import torch

    log = io.StringIO()
    t0 = time.perf_counter()
    try:
        # The exporters print progress to stdout and warnings to stderr; keep them for -v.
        with contextlib.redirect_stdout(log), quiet_torch_onnx(verbose), torch.no_grad():
            torch.onnx.export(model, args, str(out_path), **kwargs)
    except Exception as e:
        raise StageFailed(
            f"export ({recipe.export.exporter}) failed: {cause(e)}",
            f"rerun with --debug for the trace, or try export.exporter: {_other_exporter(recipe)}",
        ) from e
    seconds = time.perf_counter() - t0
    if verbose:
        print(log.getvalue())
    return seconds


def _load_checked(recipe: Recipe, out_path: Path):
    """The exported graph with portable source paths (saved back when any changed), checked
    by ONNX's checker."""
    import onnx

    try:
        proto = onnx.load(str(out_path), load_external_data=False)
        if portable_paths(proto):
            onnx.save(proto, str(out_path))
        onnx.checker.check_model(proto)
    except Exception as e:  # the exporter wrote a graph ONNX itself rejects
        raise StageFailed(f"export ({recipe.export.exporter}) wrote an invalid ONNX graph: "
                          f"{first_line(e, with_type=True)}",
                          f"try export.exporter: {_other_exporter(recipe)}") from e
    return proto


def _parity(recipe: Recipe, out_path: Path) -> metrics.Drifts:
    """check_parity against a fresh PyTorch model; a failure to run the graph as StageFailed."""
    try:
        # A fresh instance: tracing changes a transformers 5 model's later eager outputs
        # (MiniLM: max |diff| 5.46), so the traced one is no reference.
        return check_parity(recipe, models.load(recipe), out_path)
    except PipelineError:
        raise
    except Exception as e:  # e.g. out of memory at the max shape
        raise StageFailed(
            f"export parity check failed to run the graph at the opt/max shapes: {first_line(e, with_type=True)}",
            "lower the inputs' max dims if memory ran out") from e


_SOURCE_FILE = re.compile(r'File "([^"]+)"')


def portable_paths(model) -> int:
    """Rewrite absolute source file names in the graph's metadata and doc strings relative
    to the sys.path entry they lie under (the file's import path); returns how many strings
    changed. Nodes of functions and subgraphs included."""
    roots = sorted({os.path.realpath(p or ".") for p in sys.path}, key=len, reverse=True)

    def relative(match: re.Match) -> str:
        path = os.path.realpath(match.group(1))
        root = next((r for r in roots if path.startswith(r.rstrip(os.sep) + os.sep)), None)
        shown = os.path.relpath(path, root) if root else os.path.basename(path)
        return f'File "{shown}"'

    changed = 0

    def fix(holder, field: str) -> None:
        nonlocal changed
        text = getattr(holder, field)
        new = _SOURCE_FILE.sub(relative, text) if text else text
        if new != text:
            setattr(holder, field, new)
            changed += 1

    def walk(nodes) -> None:
        for node in nodes:
            fix(node, "doc_string")
            for prop in node.metadata_props:
                fix(prop, "value")
            for attr in node.attribute:
                for graph in [attr.g, *attr.graphs]:
                    walk(graph.node)

    for prop in model.metadata_props:
        fix(prop, "value")
    fix(model, "doc_string")
    fix(model.graph, "doc_string")
    walk(model.graph.node)
    for function in model.functions:
        walk(function.node)
    return changed


class ByName:
    """Calls the model with its inputs by name (built lazily as an nn.Module subclass so
    this module imports without torch)."""

    def __new__(cls, model, names: list[str]):
        import torch

        class _ByName(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *args):
                return self.model(**dict(zip(names, args)))

        return _ByName()


def cause(e: BaseException) -> str:
    """The root cause in one line: the exporters wrap the real error ("module 'triton' has
    no attribute 'language'") in a message whose first line says only which step failed and
    whose cause follows a "Next steps:" list."""
    seen, root = set(), e
    while id(root) not in seen and (root.__cause__ or root.__context__) is not None:
        seen.add(id(root))
        root = root.__cause__ or root.__context__
    if root is e:
        return first_line(e, with_type=True)
    return f"{first_line(root, with_type=True)} (in {type(e).__name__}: {first_line(e, 120)})"


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


def check_parity(recipe: Recipe, model, onnx_path: Path) -> metrics.Drifts:
    """Exported graph vs PyTorch at the opt and max profile points; StageFailed if off."""
    import numpy as np

    from pipeline.backends.torch import TorchRunner
    from pipeline.metrics import graph_check

    rng = np.random.default_rng([recipe.data.seed, 99])
    feeds = [data.random_feed(recipe.inputs, p, rng) for p in ("opt", "max")]
    onnx_out = graph_check.run(str(onnx_path), feeds, recipe.outputs)  # unoptimized: the export alone
    with TorchRunner(model, [i.name for i in recipe.inputs], recipe.outputs) as runner:
        torch_out = [runner.infer(f, check_inputs=False) for f in feeds]
    result = metrics.compare(torch_out, onnx_out, top1_outputs=[])
    spec = recipe.export.parity
    for name, m in result.items():
        if not (m.max_abs <= spec.max_abs and m.cosine >= spec.cosine_min):
            raise StageFailed(
                f"export parity: output `{name}` differs from PyTorch: max_abs {m.max_abs:.3g} "
                f"(allowed {spec.max_abs:g}), cosine {m.cosine:.6f} (allowed >= {spec.cosine_min:g})",
                "the exporter changed the model's numerics; try export.exporter: "
                + ("dynamo" if recipe.export.exporter == "torchscript" else "torchscript"),
            )
    return metrics.drifts(result)
