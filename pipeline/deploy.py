"""`pipeline deploy RECIPE --triton OUT`: a Triton Inference Server model repository.

    OUT/<recipe>-<target>/
        config.pbtxt          platform, max_batch_size, inputs/outputs (dims, data types),
                              dynamic batching, instance group, optimization
        1/model.<ext>         the engine, named as its backend's TRITON says
                              (model.onnx: onnxruntime_onnx, model.plan: tensorrt_plan)
        1/engine.json         provenance: recipe, sha256, versions, device, gates

Only engines the report vouches for are deployed: built, gates passed (unless allowed), and
the file's sha256 still the manifest's. Inputs come from the recipe (names, dynamic dims);
data types and output shapes from the ONNX graph the engine was built from.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pipeline import backends, deps
from pipeline.errors import GateFailed, InputError, IntegrityError, RecipeError
from pipeline.folders import folder_name
from pipeline.recipe import Dim, Recipe
from pipeline.store import Store, dumps, now, sha256_file, write_atomic

BATCH_NAMES = ("batch", "batch_size")

# ONNX TensorProto element type -> Triton DataType (model_config.proto)
ONNX_TO_TRITON = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16",
                  5: "TYPE_INT16", 6: "TYPE_INT32", 7: "TYPE_INT64", 8: "TYPE_STRING",
                  9: "TYPE_BOOL", 10: "TYPE_FP16", 11: "TYPE_FP64", 12: "TYPE_UINT32",
                  13: "TYPE_UINT64", 16: "TYPE_BF16"}
RECIPE_TO_TRITON = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16",
                    "int64": "TYPE_INT64", "int32": "TYPE_INT32", "bool": "TYPE_BOOL"}


@dataclass
class Tensor:
    name: str
    data_type: str        # TYPE_*
    dims: list[int]       # -1 for a dynamic dim; without the batch dim when batched
    opt: list[int] | None = None  # the profile's opt point (inputs only), same convention


@dataclass
class Engine:
    """A deployable engine: its report entry and where its files are."""

    target: str
    kind: str
    path: Path
    sha256: str
    gpu: bool             # runs on a GPU (its backend's TRITON.gpu(build meta))
    graph: Path           # the ONNX graph it was built from (for output types and shapes)
    entry: dict


# ------------------------------------------------------------------------- selection
def engines(recipe: Recipe, store: Store, wanted: tuple[str, ...], allow_failed: bool) -> list[Engine]:
    """The engines to deploy, each checked against the manifest before anything is written."""
    report_path = store.dir / "report.json"
    if not report_path.is_file():
        raise InputError(f"{report_path}: not found; nothing was built and validated there",
                         f"run `pipeline run {recipe.name}` first")
    report = store.read_json("report.json")  # IntegrityError (exit 5): changed, or not a report
    if report.get("recipe_sha256") != recipe.digest:
        raise InputError(
            f"{report_path} was made from a different version of recipe `{recipe.name}` "
            f"(sha256 {str(report.get('recipe_sha256'))[:12]}…, now {recipe.digest[:12]}…)",
            f"rerun `pipeline run {recipe.name}` with the same --set values, then deploy")
    entries = report["engines"]
    known = {e["target"] for e in entries} | {e.get("kind") for e in entries}
    for w in wanted:
        if w not in known:
            raise RecipeError(f"--target {w}: no such target in {report_path} "
                              f"(targets: {', '.join(e['target'] for e in entries)})")
    chosen = [e for e in entries if not wanted or e["target"] in wanted or e.get("kind") in wanted]
    out, refused = [], []
    for e in chosen:
        kind = _kind(e)
        if e["status"] != "built":
            refused.append(f"target `{e['target']}` was {e['status']} ({e.get('reason')})")
        elif backends.lookup(kind) is None:
            refused.append(f"target `{e['target']}`: no backend for `{kind}` engines is installed "
                           f"here (known: {', '.join(backends.kinds())})")
        elif _triton(kind) is None:
            deployable = [k for k in backends.kinds() if _triton(k)]
            refused.append(f"target `{e['target']}`: Triton has no platform for `{kind}` engines "
                           f"(deployable: {', '.join(deployable)})")
        else:
            out.append(_engine(store, e, kind))
    if refused and (wanted or not out):
        raise InputError("cannot deploy: " + "; ".join(refused))
    if refused:
        from rich.markup import escape

        from pipeline.ui import console

        for why in refused:
            console.print(f"[yellow]-[/] not deployed: {escape(why)}")
    failed = [f"{e.target}: {g['name']} ({g['detail']})"
              for e in out for g in e.entry.get("gates") or [] if not g["passed"]]
    if failed and not allow_failed:
        raise GateFailed(f"refusing to deploy engines that failed their gates: {'; '.join(failed)}",
                         "fix the variant, or pass --allow-failed-gates")
    return out


def _kind(entry: dict) -> str:
    """The engine kind: the report's, else from the engine file's suffix."""
    return (entry.get("kind") or backends.kind_of_suffix(Path(entry.get("path") or "").suffix)
            or "unknown")


def _triton(kind: str) -> backends.TritonModel | None:
    """How Triton serves `kind` (None: it cannot, or no backend here knows the kind)."""
    backend = backends.lookup(kind)
    return backend.TRITON if backend is not None else None


def _engine(store: Store, entry: dict, kind: str) -> Engine:
    stage = store.manifest["stages"].get(f"build:{entry['target']}") or {}
    name = (stage.get("outputs") or [Path(entry["path"]).name])[0]
    artifact = store.verify(name)  # IntegrityError (exit 5) when the file changed
    if artifact.sha256 != entry["sha256"]:
        raise IntegrityError(f"{artifact.path}: sha256 {artifact.sha256[:12]}… is not the engine "
                             f"the report validated ({entry['sha256'][:12]}…)", "rerun the recipe")
    meta = stage.get("meta") or {}
    gpu = _triton(kind).gpu(meta)
    graph = store.dir / meta.get("source", "model.onnx")
    return Engine(entry["target"], kind, artifact.path, artifact.sha256, gpu, graph, entry)


# ------------------------------------------------------------------------- the config
def tensors(recipe: Recipe, graph: Path) -> tuple[int, list[Tensor], list[Tensor]]:
    """(max_batch_size, inputs, outputs). Batched when every input's first dim is one shared
    dynamic `batch` dim starting at 1 and every output's first dim is that same symbol: then
    Triton owns the batch dim and the dims below leave it out."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    g_in = {v.name: v.type.tensor_type for v in model.graph.input}
    g_out = [(v.name, v.type.tensor_type) for v in model.graph.output]
    firsts = [s.shape[0] if s.shape else None for s in recipe.inputs]
    batch = firsts[0] if all(isinstance(d, Dim) for d in firsts) else None
    if batch is not None and not (batch.name in BATCH_NAMES and batch.min == 1
                                  and all(d.name == batch.name for d in firsts)):
        batch = None
    first = g_in.get(recipe.inputs[0].name)
    symbol = first.shape.dim[0].dim_param if first is not None and first.shape.dim else ""
    if batch and not (symbol and all(t.shape.dim and t.shape.dim[0].dim_param == symbol for _, t in g_out)):
        batch = None  # an output without the batch dim cannot be split back into requests
    skip = 1 if batch else 0

    inputs = []
    for spec in recipe.inputs:
        dims = [-1 if isinstance(d, Dim) else d for d in spec.shape][skip:]
        opt = list(spec.dims("opt"))[skip:]
        elem = g_in[spec.name].elem_type if spec.name in g_in else None
        inputs.append(Tensor(spec.name, ONNX_TO_TRITON.get(elem, RECIPE_TO_TRITON[spec.dtype]), dims, opt))
    outputs = []
    for name, t in g_out:
        if t.elem_type not in ONNX_TO_TRITON:
            raise InputError(f"{graph}: output `{name}` has ONNX type {t.elem_type}, which Triton cannot serve")
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim][skip:]
        outputs.append(Tensor(name, ONNX_TO_TRITON[t.elem_type], dims))
    return (batch.max if batch else 0), inputs, outputs


def config_pbtxt(name: str, engine_kind: str, gpu: bool, max_batch: int, inputs: list[Tensor],
                 outputs: list[Tensor], instances: int = 1, queue_delay_us: int = 100,
                 opt_batch: int | None = None) -> str:
    """config.pbtxt in protobuf text format (inference.ModelConfig)."""
    triton = _triton(engine_kind)
    lines = [f'name: "{name}"', f'platform: "{triton.platform}"', f"max_batch_size: {max_batch}"]
    for field, items in (("input", inputs), ("output", outputs)):
        for t in items:
            lines += [f"{field} {{", f'  name: "{t.name}"', f"  data_type: {t.data_type}",
                      f"  dims: [{', '.join(map(str, t.dims))}]", "}"]
    if max_batch > 0:
        preferred = sorted({b for b in (opt_batch, max_batch) if b})
        lines += ["dynamic_batching {", f"  preferred_batch_size: [{', '.join(map(str, preferred))}]",
                  f"  max_queue_delay_microseconds: {queue_delay_us}", "}"]
    lines += ["instance_group {", f"  count: {instances}", f"  kind: {'KIND_GPU' if gpu else 'KIND_CPU'}", "}"]
    lines += triton.optimization(max_batch, opt_batch, inputs)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------- writing
def deploy(recipe: Recipe, engines_root: Path, out: Path, wanted: tuple[str, ...] = (),
           version: int = 1, instances: int = 1, allow_failed: bool = False) -> list[Path]:
    """Write one model per engine into the repository OUT; returns the model folders."""
    store = Store(engines_root, folder_name(recipe))
    chosen = engines(recipe, store, wanted, allow_failed)
    written = []
    for e in chosen:
        model = f"{recipe.name}-{e.target}"
        max_batch, inputs, outputs = tensors(recipe, e.graph)
        batch_dims = [s.shape[0] for s in recipe.inputs if s.shape and isinstance(s.shape[0], Dim)]
        opt_batch = batch_dims[0].opt if max_batch and batch_dims else None
        text = config_pbtxt(model, e.kind, e.gpu, max_batch, inputs, outputs, instances, opt_batch=opt_batch)
        folder = out / model
        _place(e, folder / str(version) / _triton(e.kind).model_file)
        write_atomic(folder / str(version) / "engine.json", dumps({
            "recipe": recipe.name, "recipe_sha256": recipe.digest, "target": e.target,
            "kind": e.kind, "sha256": e.sha256, "bytes": e.path.stat().st_size,
            "precision": e.entry.get("precision"), "gates": e.entry.get("gates"),
            "versions": store.manifest.get("versions"), "device": store.manifest.get("device"),
            "deployed": now(), "deployed_with": deps.versions().get("pipeline"),
        }))
        write_atomic(folder / "config.pbtxt", text)
        written.append(folder)
    return written


def _place(engine: Engine, dest: Path) -> None:
    """Copy to a temporary name, check the copy's sha256, rename into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.copyfile(engine.path, tmp)
    if sha256_file(tmp) != engine.sha256:
        tmp.unlink()
        raise IntegrityError(f"{dest}: the copy of {engine.path} does not have its sha256",
                             "check the disk and retry")
    os.replace(tmp, dest)
