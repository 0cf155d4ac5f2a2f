"""TensorRT target: a strongly typed engine built through Polygraphy's loaders.

    NetworkFromOnnxPath(strongly_typed) -> CreateConfig(profiles, optimization level, pools,
    timing cache, hardware compatibility, DETAILED verbosity) -> EngineFromNetwork -> SaveEngine

Precision is whatever the ONNX graph says (casts, Q/DQ): strongly typed networks take no
precision flags. Beside the engine the build writes `<id>.inspector.json` (TensorRT's engine
inspector, loadable by TREx) and `<id>.build.json` (what built it, the equivalent trtexec
and `polygraphy convert` command lines, per-layer timing and the effective precision).

Everything up to `build()` is pure Python over Polygraphy's lazily importing loaders, so the
chain, the command lines and the compatibility check are exercised on machines without
TensorRT; TensorRT enums are resolved through `enum(kind, name)` only when the chain runs.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.backends import tensorrt_layers
from pipeline.backends.base import TritonModel, ValidationExtras
from pipeline.core import deps, env
from pipeline.core.errors import InputError, StageFailed
from pipeline.core.json_object import JsonObject
from pipeline.model import onnx_info
from pipeline.recipe import Dim, Recipe, TensorRTTarget

EXTENSION = ".plan"
PLAIN_ONNX = True  # builds only from ONNX-domain ops: run/chain.py gives it a graph without ORT fusions
TARGET = TensorRTTarget
NEEDS_ONNX = True
ENGINE_IS_ONNX = False


def _triton_optimization(policy, max_batch: int, opt_batch: int | None, inputs: list) -> None:
    """Triton's TensorRT backend replays CUDA Graphs (launch-bound small batches gain most):
    one graph captured at the profile's opt point, other shapes fall back to plain enqueue."""
    policy.cuda.graphs = True
    spec = policy.cuda.graph_spec.add()
    if max_batch > 0:
        spec.batch_size = opt_batch or 0
    for t in inputs:
        spec.input[t.name].dim.extend(t.opt or [])


TRITON = TritonModel("tensorrt_plan", "model.plan", gpu=lambda build_meta: True,
                     optimization=_triton_optimization)
Shape = tuple[int, ...]


# ----------------------------------------------------------------------------- the plan
@dataclass
class BuildPlan:
    """Everything the recipe decides about one engine build, in plain data."""

    onnx: Path
    engine: Path
    profiles: list[dict[str, tuple[Shape, Shape, Shape]]]  # input -> (min, opt, max)
    optimization_level: int
    pools: dict[str, int] = field(default_factory=dict)  # trt.MemoryPoolType name -> bytes
    hardware_compatibility: str | None = None  # trt.HardwareCompatibilityLevel name
    timing_cache: Path | None = None
    strongly_typed: bool = True
    profiling_verbosity: str = "DETAILED"
    # every input dim fixed in the recipe: the exported graph has no dynamic dim
    static_shapes: bool = False


def profiles(recipe: Recipe, target: TensorRTTarget) -> list[dict[str, tuple[Shape, Shape, Shape]]]:
    """Profile 0 is the inputs' own min/opt/max; each extra one overrides named dims."""
    out = []
    for override in [{}, *target.profiles]:
        profile = {}
        for spec in recipe.inputs:
            dims = [d if isinstance(d, int) else override.get(d.name or "", d) for d in spec.shape]
            profile[spec.name] = tuple(
                tuple(d if isinstance(d, int) else getattr(d, k) for d in dims)
                for k in ("min", "opt", "max"))
        out.append(profile)
    return out


def cache_dir() -> Path:
    return env.cache_root() / "tensorrt"


def timing_cache_path(tensorrt_version: str, gpu: str, compute_capability: str) -> Path:
    """One timing cache per GPU model and TensorRT version: tactics timed elsewhere don't apply."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    return cache_dir() / f"timing-{slug}-sm{compute_capability}-trt{tensorrt_version}.cache"


def plan(onnx: Path, engine: Path, recipe: Recipe, target: TensorRTTarget,
         built_with: dict) -> BuildPlan:
    pools = {}
    if target.workspace_mib:
        pools["WORKSPACE"] = target.workspace_mib << 20
    if target.tactic_shared_memory_kib:
        pools["TACTIC_SHARED_MEMORY"] = target.tactic_shared_memory_kib << 10
    cache = (timing_cache_path(built_with["tensorrt"], built_with["gpu"], built_with["compute_capability"])
             if target.timing_cache else None)
    return BuildPlan(
        onnx=Path(onnx), engine=Path(engine), profiles=profiles(recipe, target),
        optimization_level=target.optimization_level, pools=pools,
        hardware_compatibility=None if target.hardware_compatibility == "none" else "AMPERE_PLUS",
        timing_cache=cache,
        static_shapes=not any(isinstance(d, Dim) for spec in recipe.inputs for d in spec.shape),
    )


def _real_enum(kind: str, name: str):
    import tensorrt as trt

    return getattr(getattr(trt, kind), name)


def loaders(p: BuildPlan, enum=_real_enum):
    """The Polygraphy loader chain; calling the result builds, saves and returns the engine."""
    from polygraphy.backend.trt import (
        CreateConfig,
        EngineFromNetwork,
        NetworkFromOnnxPath,
        Profile,
        SaveEngine,
    )

    trt_profiles = []
    for profile in p.profiles:
        prof = Profile()
        for name, (lo, opt, hi) in profile.items():
            prof.add(name, min=list(lo), opt=list(opt), max=list(hi))
        trt_profiles.append(prof)
    cache = str(p.timing_cache) if p.timing_cache else None
    config = CreateConfig(
        profiles=trt_profiles,
        builder_optimization_level=p.optimization_level,
        memory_pool_limits={enum("MemoryPoolType", k): v for k, v in p.pools.items()} or None,
        hardware_compatibility_level=(enum("HardwareCompatibilityLevel", p.hardware_compatibility)
                                      if p.hardware_compatibility else None),
        profiling_verbosity=enum("ProfilingVerbosity", p.profiling_verbosity),
        load_timing_cache=cache,
    )
    # Hardware-compatible engines need TensorRT's native InstanceNorm (Polygraphy does the same).
    flags = [enum("OnnxParserFlag", "NATIVE_INSTANCENORM")] if p.hardware_compatibility else None
    network = NetworkFromOnnxPath(str(p.onnx), flags=flags, strongly_typed=p.strongly_typed)
    engine = EngineFromNetwork(network, config=config, save_timing_cache=cache)
    return SaveEngine(engine, path=str(p.engine))


# ----------------------------------------------------------------------------- command lines
def _dims(shape: Shape, sep: str) -> str:
    return sep.join(str(d) for d in shape)


def polygraphy_command(p: BuildPlan) -> list[str]:
    cmd = ["polygraphy", "convert", str(p.onnx), "--convert-to", "trt", "-o", str(p.engine)]
    cmd += ["--strongly-typed"] if p.strongly_typed else []
    for profile in p.profiles:
        for flag, k in (("--trt-min-shapes", 0), ("--trt-opt-shapes", 1), ("--trt-max-shapes", 2)):
            cmd += [flag, *(f"{n}:[{_dims(s[k], ',')}]" for n, s in profile.items())]
    cmd += ["--builder-optimization-level", str(p.optimization_level)]
    if p.pools:
        cmd += ["--pool-limit", *(f"{k.lower()}:{v}" for k, v in p.pools.items())]
    if p.hardware_compatibility:
        cmd += ["--hardware-compatibility-level", p.hardware_compatibility.lower()]
    if p.timing_cache:
        cmd += ["--load-timing-cache", str(p.timing_cache), "--save-timing-cache", str(p.timing_cache)]
    return cmd + ["--profiling-verbosity", p.profiling_verbosity.lower()]


_TRTEXEC_POOLS = {"WORKSPACE": ("workspace", 20, "M"), "TACTIC_SHARED_MEMORY": ("tacticSharedMem", 10, "K")}


def trtexec_command(p: BuildPlan, inspector_json: Path | None = None) -> list[str]:
    cmd = ["trtexec", f"--onnx={p.onnx}", f"--saveEngine={p.engine}"]
    cmd += ["--stronglyTyped"] if p.strongly_typed else []
    # trtexec turns TF32 on unless told not to; Polygraphy's CreateConfig (the build above)
    # leaves it off, and strongly typed networks still honour the flag.
    cmd.append("--noTF32")
    # A network without dynamic dims takes no shapes: trtexec refuses them ("Static model does
    # not take explicit shapes ..."). Polygraphy's build fills its profile with the fixed shapes.
    for i, profile in enumerate([] if p.static_shapes else p.profiles):
        # One min/opt/max set stands alone; with several, trtexec wants `--profile=i` right
        # before each set (it refuses repeated sets without it).
        cmd += [f"--profile={i}"] if len(p.profiles) > 1 else []
        for flag, k in (("--minShapes", 0), ("--optShapes", 1), ("--maxShapes", 2)):
            cmd.append(f"{flag}=" + ",".join(f"{n}:{_dims(s[k], 'x')}" for n, s in profile.items()))
    cmd.append(f"--builderOptimizationLevel={p.optimization_level}")
    if p.pools:
        specs = [f"{_TRTEXEC_POOLS[k][0]}:{v >> _TRTEXEC_POOLS[k][1]}{_TRTEXEC_POOLS[k][2]}"
                 for k, v in p.pools.items()]
        cmd.append("--memPoolSize=" + ",".join(specs))
    if p.hardware_compatibility:
        cmd.append("--hardwareCompatibilityLevel=ampere+")
    if p.timing_cache:
        cmd.append(f"--timingCacheFile={p.timing_cache}")
    cmd.append(f"--profilingVerbosity={p.profiling_verbosity.lower()}")
    return cmd + ([f"--exportLayerInfo={inspector_json}"] if inspector_json else [])


@dataclass(frozen=True)
class RebuildCommands:
    """Both rebuild commands, with paths relative to `cwd` (the recipe's engines folder)."""

    cwd: str
    trtexec: str
    polygraphy: str

    def dump(self) -> JsonObject:
        return {"cwd": self.cwd, "trtexec": self.trtexec, "polygraphy": self.polygraphy}


def command_lines(p: BuildPlan, inspector_name: str) -> RebuildCommands:
    local = BuildPlan(**{**p.__dict__, "onnx": Path(p.onnx.name), "engine": Path(p.engine.name)})
    return RebuildCommands(cwd="engines/<recipe>/",
                           trtexec=shlex.join(trtexec_command(local, Path(inspector_name))),
                           polygraphy=shlex.join(polygraphy_command(local)))


# ----------------------------------------------------------------------------- compatibility
def here() -> JsonObject:
    """This machine's `built_with` block (TensorRT version, GPU, compute capability), as the
    build record writes it and open() compares it with the engine's (check_compatible)."""
    gpu, cc = deps.gpus()[0] if deps.gpus() else (None, None)
    return {"tensorrt": deps.version("tensorrt"), "gpu": gpu, "compute_capability": cc}


def _describe(w: dict) -> str:
    gpu = f"{w['gpu']} (sm {w['compute_capability']})" if w.get("gpu") else "no GPU"
    return f"TensorRT {w.get('tensorrt') or 'not installed'} on {gpu}"


def check_compatible(engine: Path, built: dict, current: dict, hardware_compatible: bool) -> None:
    """Refuse an engine built by another TensorRT version or for another GPU, naming both."""
    same_trt = built.get("tensorrt") == current.get("tensorrt")
    same_gpu = (built.get("gpu"), built.get("compute_capability")) == \
        (current.get("gpu"), current.get("compute_capability"))
    if hardware_compatible and current.get("compute_capability"):
        # ampere_plus: any sm 8.0+ data-centre or desktop GPU; not Jetson Orin (sm 8.7), where
        # TensorRT offers no hardware compatibility
        cc = current["compute_capability"]
        same_gpu = float(cc) >= 8.0 and cc != "8.7"
    if not (same_trt and same_gpu):
        raise InputError(
            f"{engine} was built with {_describe(built)}; this machine has {_describe(current)}",
            "TensorRT engines are tied to both: rebuild it here (pipeline build RECIPE --force)",
        )


# ----------------------------------------------------------------------------- backend API
def unavailable(target: TensorRTTarget) -> str | None:
    if not deps.has("tensorrt"):
        return f"TensorRT is not installed ({deps.install_hint('tensorrt')})"
    if not deps.gpus():
        return "TensorRT needs an NVIDIA GPU; none was found (nvidia-smi)"
    return None


def sidecars(engine: Path) -> tuple[Path, Path]:
    """(<id>.inspector.json, <id>.build.json) beside the engine."""
    stem = engine.with_suffix("")
    return stem.with_name(stem.name + ".inspector.json"), stem.with_name(stem.name + ".build.json")


def _build_info(info_path: Path, key: str) -> JsonObject:
    """One section of <id>.build.json, read bounded (a planted file is refused in one line)."""
    from pipeline.artifacts import json_file
    from pipeline.core.errors import IntegrityError

    try:
        data = json_file.read(info_path)
    except json_file.Unreadable as e:
        raise IntegrityError(f"{info_path}: {e.problem}", "rebuild the engine with `pipeline run --force`") from None
    section = data.get(key) if isinstance(data, dict) else None
    if not isinstance(section, dict):
        raise IntegrityError(f"{info_path}: no `{key}` object, not the build record the pipeline wrote",
                             "rebuild the engine with `pipeline run --force`")
    return section


def check_parseable(onnx_path: Path) -> None:
    """StageFailed naming the ops TensorRT cannot parse, before any TensorRT work.

    The parser looks an op it does not know up as a plugin of the same name; ONNX Runtime's
    contrib ops (com.microsoft: MultiHeadAttention, RotaryEmbedding, ...; and those ORT writes
    in the default domain, SimplifiedLayerNormalization, ...) have none, so the build would
    fail deep in the parser ("Plugin not found"). run/chain.py hands this target the
    graph of a chain without ORT-only passes (PLAIN_ONNX); what still is foreign came from
    elsewhere (the exporter, a custom pass) and is the user's to change.
    """
    foreign = onnx_info.foreign_ops(onnx_path)
    if foreign:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(foreign.items()))
        bare = [op for op in foreign if "." not in op]
        where = (f"; {', '.join(sorted(bare))}: ONNX Runtime contrib ops in the default domain, "
                 "no ONNX op" if bare else "")
        raise StageFailed(f"TensorRT cannot parse {ops} in {Path(onnx_path).name}{where}",
                          "TensorRT imports ONNX ops only: drop the pass or export "
                          "option that writes these")


def build_meta(p: BuildPlan, target: TensorRTTarget, built_with: dict, seconds: float,
               inspector_name: str) -> JsonObject:
    """What the build records (its stage meta and <id>.build.json): every setting read from
    the plan that built the engine."""
    return {
        "built_with": built_with, "hardware_compatibility": target.hardware_compatibility,
        "build_seconds": seconds, "strongly_typed": p.strongly_typed,
        "profiles": [{n: [list(s) for s in mm] for n, mm in prof.items()} for prof in p.profiles],
        "optimization_level": p.optimization_level, "memory_pools": p.pools,
        "timing_cache": str(p.timing_cache) if p.timing_cache else None,
        "commands": command_lines(p, inspector_name).dump(),
    }


def build(onnx_path: Path, target: TensorRTTarget, recipe: Recipe, workdir: Path):
    from pipeline import data
    from pipeline.backends.tensorrt_runner import TensorRTRunner

    check_parseable(onnx_path)
    built_with = here()
    engine_path = workdir / f"{target.id}{EXTENSION}"
    p = plan(onnx_path, engine_path, recipe, target, built_with)
    if p.timing_cache:
        p.timing_cache.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    engine = loaders(p)()
    seconds = time.perf_counter() - t0
    # Layer truth at the opt point: per-layer times, then the inspector with formats resolved.
    feed = data.feeds(recipe, "export")[0]
    with TensorRTRunner(engine, cuda_graphs=False, name=target.id) as runner:
        layer_ms = runner.layer_times(feed)
        inspector_text = runner.inspector_json()
    inspector = json.loads(inspector_text)
    summary = tensorrt_layers.effective_precision(inspector, layer_ms)
    inspector_path, info_path = sidecars(engine_path)
    inspector_path.write_text(inspector_text)
    meta = build_meta(p, target, built_with, seconds, inspector_path.name)
    info_path.write_text(json.dumps({**meta, "tensorrt_layer_shares": summary}, indent=2) + "\n")
    short = {k: v for k, v in summary.items() if k != "per_layer"}
    return engine_path, {**meta, "tensorrt_layer_shares": short,
                         "files": {inspector_path.name: inspector_path, info_path.name: info_path}}


def device(target: TensorRTTarget) -> str:
    return "cuda"


def open(engine_path: Path, target: TensorRTTarget, recipe: Recipe | None = None, *,  # noqa: A001
         threads: int | None = None, spin: bool = True):
    """A runner over a saved engine; refuses an engine built for another GPU or TensorRT."""
    from pipeline.backends.tensorrt_runner import TensorRTRunner

    _, info_path = sidecars(Path(engine_path))
    built = _build_info(info_path, "built_with") if info_path.is_file() else {}
    check_compatible(Path(engine_path), built, here(), target.hardware_compatibility != "none")
    return TensorRTRunner(engine_path, cuda_graphs=target.cuda_graphs, name=target.id)


def validation_extras(engine_path: Path, target: TensorRTTarget, recipe: Recipe,
                      runner) -> ValidationExtras:
    """What validate adds for this engine: CUDA Graph status, effective precision, its gate."""
    _, info_path = sidecars(Path(engine_path))
    summary = _build_info(info_path, "tensorrt_layer_shares") if info_path.is_file() else None
    extras = {"runtime": dict(runner.details), "gates": []}
    if summary is not None:
        extras["tensorrt_layer_shares"] = {k: v for k, v in summary.items() if k != "per_layer"}
    # The target's own precision name only: the `precision:` section's key of the same name is
    # a share of MatMul FLOPs that ONNX Runtime runs in integer kernels (validate.py judges it).
    if target.require_layer_precision:
        extras["gates"].append(tensorrt_layers.check_required(
            summary or {"detailed": False}, target.require_layer_precision,
            target.layer_precision_min_share))
    return extras


__all__ = ["BuildPlan", "build", "open", "unavailable", "plan", "loaders",
           "polygraphy_command", "trtexec_command", "check_compatible", "timing_cache_path"]
