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

The engines folder is untrusted input (a downloaded CI artifact): a report target must be
one of the recipe's targets and a plain name, every file read (engine and source graph) is
a regular file in the folder with the manifest's sha256, and each model folder is written
under a temporary name inside OUT and renamed into place whole. config.pbtxt is written by
protobuf's text_format from Triton's own schema (tritonclient's model_config_pb2), so no
name from a recipe or graph can inject a field.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pipeline import backends
from pipeline.artifacts import dump, engine_format
from pipeline.core import deps, paths, safe_files
from pipeline.core.errors import (
    DependencyError,
    GateFailed,
    InputError,
    IntegrityError,
    RecipeError,
)
from pipeline.recipe import Dim, Recipe
from pipeline.recipe.serve import batching
from pipeline.run import gate_recheck
from pipeline.store.folder_names import folder_name
from pipeline.store.recipe_folder import Store, dumps, now, sha256_file

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
    store.check_folder()  # a link in the folder's place is refused, never read through
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
    _check_targets(recipe, store, entries)
    known = {e["target"] for e in entries} | {e.get("kind") for e in entries}
    for w in wanted:
        if w not in known:
            raise RecipeError(f"--target {w}: no such target in {report_path} "
                              f"(targets: {', '.join(e['target'] for e in entries)})")
    chosen = [e for e in entries if not wanted or e["target"] in wanted or e.get("kind") in wanted]
    out, refused = [], []
    gate_recheck.refuse_failing(recipe, report_path, chosen)  # gates recomputed, not taken on trust
    for e in chosen:
        kind = _kind(recipe, e)
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
        from pipeline.core.text import escape  # markup and control characters
        from pipeline.core.ui import console

        for why in refused:
            console.print(f"[yellow]-[/] not deployed: {escape(why)}")
    failed = [f"{e.target}: {g['name']} ({g['detail']})"
              for e in out for g in e.entry.get("gates") or [] if not g["passed"]]
    if failed and not allow_failed:
        raise GateFailed(f"refusing to deploy engines that failed their gates: {'; '.join(failed)}",
                         "fix the variant, or pass --allow-failed-gates")
    return out


def _check_targets(recipe: Recipe, store: Store, entries: list[dict]) -> None:
    """Each report target becomes a model folder name: it must be one of the recipe's."""
    ids = {t.id for t in recipe.targets}
    for e in entries:
        if paths.name_problem(e["target"]) or e["target"] not in ids:
            raise IntegrityError(
                f"{store.dir / 'report.json'}: engine target {e['target']!r} is not a target of "
                f"recipe `{recipe.name}` ({', '.join(sorted(ids))}); the report was changed after the build",
                f"rebuild with `pipeline run {recipe.name} --force`")


def _kind(recipe: Recipe, entry: dict) -> str:
    """The engine kind: the recipe's target's (the recipe is code, the report is data; the
    report's own `kind` was checked against it by gate_recheck)."""
    return next(t.kind for t in recipe.targets if t.id == entry["target"])  # _check_targets ran


def _triton(kind: str) -> backends.TritonModel | None:
    """How Triton serves `kind` (None: it cannot, or no backend here knows the kind)."""
    backend = backends.lookup(kind)
    return backend.TRITON if backend is not None else None


def _engine(store: Store, entry: dict, kind: str) -> Engine:
    stage = store.stage_record(f"build:{entry['target']}")
    name = (stage.outputs if stage and stage.outputs else [Path(entry["path"]).name])[0]
    reported = Path(str(entry.get("path") or ""))
    if reported.name != name or ".." in reported.parts:  # what `verify` checks too
        raise IntegrityError(f"{store.dir / 'report.json'}: target `{entry['target']}` reports its "
                             f"engine as {str(entry.get('path'))!r}, not the file {name} the build "
                             "recorded; the report was changed after the build",
                             f"rebuild with `pipeline run {store.dir.name} --force`")
    artifact = store.verify(name)  # IntegrityError (exit 5) when the file changed
    wrong_format = engine_format.mismatch(kind, artifact.path)  # its bytes, not the report's word
    if wrong_format:
        raise IntegrityError(f"{artifact.path}: {wrong_format}; the folder was changed after the build",
                             f"rebuild with `pipeline run {store.dir.name} --force`")
    if artifact.sha256 != entry["sha256"]:
        raise IntegrityError(f"{artifact.path}: sha256 {artifact.sha256[:12]}… is not the engine "
                             f"the report validated ({entry['sha256'][:12]}…)", "rerun the recipe")
    meta = stage.meta if stage else {}
    gpu = _triton(kind).gpu(meta)
    # the graph is read for output types and shapes: a recorded file of the folder, unchanged
    graph = store.verify(_source_name(store, meta.get("source", "model.onnx"))).path
    return Engine(entry["target"], kind, artifact.path, artifact.sha256, gpu, graph, entry)


def _source_name(store: Store, source: object) -> str:
    """The build's source graph: a file name the manifest records (never a path)."""
    if paths.name_problem(source) or not str(source).endswith(".onnx"):
        raise IntegrityError(f"{store.dir / 'manifest.json'}: the build's source graph {source!r} is "
                             "not an ONNX file of this folder; the manifest was changed after the build",
                             f"rebuild with `pipeline run {store.dir.name} --force`")
    return str(source)


# ------------------------------------------------------------------------- the config
def tensors(recipe: Recipe, graph: Path) -> tuple[int, list[Tensor], list[Tensor]]:
    """(max_batch_size, inputs, outputs). Batched when every input's first dim is one shared
    dynamic `batch` dim starting at 1 and every output's first dim is that same symbol: then
    Triton owns the batch dim and the dims below leave it out."""
    import onnx

    model = onnx.load_from_string(safe_files.read_bytes(graph))  # no symlink, no external data
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
                 opt_batch: int | None = None, preferred: tuple[int, ...] | None = None,
                 max_queue_size: int = 0) -> str:
    """config.pbtxt in protobuf text format (inference.ModelConfig), written by text_format
    from Triton's schema: every name is escaped, whatever characters it holds. `preferred`
    (default: opt_batch and max_batch), `queue_delay_us` and `max_queue_size` are the
    recipe's `serve:` batching, the rules `pipeline serve` batches by."""
    from google.protobuf import text_format

    mc = model_config()
    triton = _triton(engine_kind)
    config = mc.ModelConfig(name=name, platform=triton.platform, max_batch_size=max_batch)
    for field, items in ((config.input, inputs), (config.output, outputs)):
        for t in items:
            field.add(name=t.name, data_type=mc.DataType.Value(t.data_type), dims=t.dims)
    if max_batch > 0:
        sizes = sorted({b for b in (opt_batch, max_batch) if b}) if preferred is None else preferred
        config.dynamic_batching.preferred_batch_size.extend(sizes)
        config.dynamic_batching.max_queue_delay_microseconds = queue_delay_us
        if max_queue_size:
            config.dynamic_batching.default_queue_policy.max_queue_size = max_queue_size
    config.instance_group.add(count=instances, kind=mc.ModelInstanceGroup.KIND_GPU if gpu
                              else mc.ModelInstanceGroup.KIND_CPU)
    triton.optimization(config.optimization, max_batch, opt_batch, inputs)
    return text_format.MessageToString(config, use_short_repeated_primitives=True)


def model_config():
    """Triton's model-config schema (tritonclient[grpc]'s model_config_pb2)."""
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError as e:
        raise DependencyError(f"`pipeline deploy` writes config.pbtxt from Triton's model-config schema, "
                              f"which needs tritonclient[grpc] ({e})",
                              "pip install 'engine-pipeline[deploy]' (or tritonclient[grpc])") from None
    return model_config_pb2


# ------------------------------------------------------------------------- writing
def deploy(recipe: Recipe, engines_root: Path, out: Path, wanted: tuple[str, ...] = (),
           version: int = 1, instances: int = 1, allow_failed: bool = False) -> list[Path]:
    """Write one model per engine into the repository OUT; returns the model folders."""
    model_config()  # DependencyError before anything is read or written
    store = Store(engines_root, folder_name(recipe))
    chosen = engines(recipe, store, wanted, allow_failed)
    written = []
    for e in chosen:
        model = f"{recipe.name}-{e.target}"
        max_batch, inputs, outputs = tensors(recipe, e.graph)
        batch_dims = [s.shape[0] for s in recipe.inputs if s.shape and isinstance(s.shape[0], Dim)]
        opt_batch = batch_dims[0].opt if max_batch and batch_dims else None
        preferred, serve = None, recipe.serve
        if max_batch:  # the recipe's serve: section, as `pipeline serve` batches
            max_batch, preferred = batching(serve, recipe.inputs)
            opt_batch = min(opt_batch, max_batch) if opt_batch else None
        text = config_pbtxt(model, e.kind, e.gpu, max_batch, inputs, outputs, instances,
                            serve.max_queue_delay_us, opt_batch, preferred, serve.max_queue_size)
        engine_json = dumps({
            "recipe": recipe.name, "recipe_sha256": recipe.digest, "target": e.target,
            "kind": e.kind, "sha256": e.sha256, "bytes": e.path.stat().st_size,
            "precision": e.entry.get("precision"), "gates": e.entry.get("gates"),
            "versions": store.manifest.versions,
            "device": dump(store.manifest.device) if store.manifest.device else None,
            "deployed": now(), "deployed_with": deps.versions().get("pipeline"),
        })
        with _model_folder(out, model) as folder:
            _place(e, folder / str(version) / _triton(e.kind).model_file)
            _write_new(folder / str(version) / "engine.json", engine_json.encode())
            _write_new(folder / "config.pbtxt", text.encode())
            _keep_other_versions(out / model, folder, version)
        written.append(out / model)
    return written


@contextlib.contextmanager
def _model_folder(out: Path, model: str):
    """A new, empty folder OUT/.<model>.<pid>.tmp to write the model in; on success it
    replaces OUT/<model> whole (a failure or a kill never leaves a half-written model under
    the name Triton loads). Every path is a direct child of OUT."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        dest = paths.child(out, model)  # model is a plain name: the hidden names below are too
    except ValueError as e:
        raise IntegrityError(f"{out}: model folder {e}") from None
    if os.path.lexists(dest) and (dest.is_symlink() or not dest.is_dir()):
        raise InputError(f"{dest}: is {safe_files.kind(dest) or 'a file'}, not a model folder",
                         "remove it, or deploy into another --triton folder")
    _sweep(out, model)
    tmp, old = (out / f".{model}.{os.getpid()}.{end}" for end in ("tmp", "old"))
    _remove(tmp)  # left by a killed deploy that had this pid
    tmp.mkdir()
    try:
        yield tmp
        if os.path.lexists(dest):
            _remove(old)
            os.rename(dest, old)
            os.rename(tmp, dest)
            _remove(old)
        else:
            os.rename(tmp, dest)
    except BaseException:
        _remove(tmp)
        raise


def _sweep(out: Path, model: str) -> None:
    """Remove what a killed deploy of this model left: `.<model>.<pid>.tmp|old` of a process
    that is gone (a live one may be another deploy at work)."""
    for stray in out.glob(f".{model}.*"):
        pid, _, end = stray.name[len(model) + 2:].partition(".")
        if not (pid.isdigit() and end in ("tmp", "old")):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            _remove(stray)
        except OSError:  # alive, another user's
            continue


def _remove(path: Path) -> None:
    """Remove a file, a link (not what it points to) or a folder tree, if there."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _keep_other_versions(dest: Path, folder: Path, version: int) -> None:
    """The other version folders of an earlier deploy of this model go into the new folder."""
    if not dest.is_dir() or dest.is_symlink():
        return
    for old in dest.iterdir():
        if old.name.isdigit() and old.name != str(version) and old.is_dir() and not old.is_symlink():
            shutil.copytree(old, folder / old.name, symlinks=True)


def _write_new(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with safe_files.create_exclusive(path) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _place(engine: Engine, dest: Path) -> None:
    """Copy the engine (never through a symlink) and check the copy's sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with safe_files.open_regular(engine.path) as src, safe_files.create_exclusive(dest) as f:
        shutil.copyfileobj(src, f, 1 << 20)
        f.flush()
        os.fsync(f.fileno())
    if sha256_file(dest) != engine.sha256:
        raise IntegrityError(f"{dest}: the copy of {engine.path} does not have its sha256",
                             "check the disk and retry")
