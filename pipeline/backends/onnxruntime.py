"""ONNX Runtime target: the session-optimized graph, saved, is the engine.

Build runs ORT's graph optimizer once (at the recipe's level) and saves the result; the
runner loads that file with optimization disabled, so what is timed is exactly the file
whose sha256 the manifest records.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path

from polygraphy.backend.base import BaseRunner

from pipeline.backends.base import TritonModel
from pipeline.core import deps
from pipeline.core.errors import StageFailed
from pipeline.core.text import first_line
from pipeline.model import compact_storage
from pipeline.recipe import OnnxRuntimeTarget, Recipe

TARGET = OnnxRuntimeTarget
EXTENSION = ".onnx"
NEEDS_ONNX = True
PLAIN_ONNX = False  # takes ORT's contrib ops and fusions
ENGINE_IS_ONNX = True  # the saved, session-optimized graph

_PROVIDER = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def unavailable(target: OnnxRuntimeTarget) -> str | None:
    if not deps.has("onnxruntime"):
        return f"onnxruntime is not installed ({deps.install_hint('onnxruntime')})"
    if target.provider == "cuda" and not deps.gpus():
        return "provider `cuda` needs an NVIDIA GPU; none was found (nvidia-smi)"
    return None


def device(target: OnnxRuntimeTarget) -> str:
    return "cuda" if providers(target)[0] == _PROVIDER["cuda"] else "cpu"


def providers(target: OnnxRuntimeTarget) -> list[str]:
    """The execution providers to ask for; `auto` takes CUDA only where it can work."""
    import onnxruntime as ort

    kind = target.provider
    if kind == "auto":
        cuda_ok = "CUDAExecutionProvider" in ort.get_available_providers() and deps.gpus()
        kind = "cuda" if cuda_ok else "cpu"
    chosen = [_PROVIDER[kind]]
    return chosen + (["CPUExecutionProvider"] if kind != "cpu" else [])


def _session(path: Path, target: OnnxRuntimeTarget, level, threads: int | None,
             save_to: Path | None, spin: bool = True, keep_qdq: bool = False):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if keep_qdq:
        # FP8 Q/DQ: the CPU provider has no FP8 kernels for fused groups; keep Q/DQ as they
        # are (emulated). The runner loads the saved graph unoptimized, so it needs nothing.
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.graph_optimization_level = level
    options.log_severity_level = 3  # errors only: ORT warns about every unused initializer
    if threads:
        options.intra_op_num_threads = threads
    if save_to is not None:
        options.optimized_model_filepath = str(save_to)
    wanted = providers(target)
    try:
        session = ort.InferenceSession(str(path), options, providers=wanted)
    except Exception as e:  # ORT raises its own classes: a truncated or corrupt graph lands here
        detail = first_line(e)
        raise StageFailed(f"onnxruntime cannot load {path.name}: {detail}",
                          "the file is damaged; rebuild with --force") from e
    # No silent fallback: onnxruntime-gpu quietly drops to CPU when CUDA cannot load.
    if session.get_providers()[0] != wanted[0]:
        raise StageFailed(
            f"onnxruntime asked for {wanted[0]} but the session runs on {session.get_providers()[0]}",
            "check the CUDA installation, or set the target's provider: cpu",
        )
    return session


def build(onnx_path: Path, target: OnnxRuntimeTarget, recipe: Recipe, workdir: Path):
    import onnxruntime as ort

    levels = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    engine = workdir / f"{target.id}{EXTENSION}"
    t0 = time.perf_counter()
    session = _session(onnx_path, target, levels[target.optimization_level], None, engine,
                       keep_qdq=recipe.precision.mode == "fp8")
    providers = session.get_providers()
    del session
    stored = None
    if recipe.workload.kind == "generation":
        # A decoder's runners load at ORT's default level (generation/runners.py), which folds
        # the fp16 storage's Casts at load; the tensor runner here loads unoptimized and would
        # run them every request, so only generation engines are stored compactly.
        stored = compact_storage.compact_file(engine).as_dict()
    seconds = time.perf_counter() - t0
    return engine, {
        "providers": providers,
        "optimization_level": target.optimization_level,
        "onnxruntime": ort.__version__,
        "build_seconds": seconds,
        **({"compact_storage": stored} if stored else {}),
    }


class OnnxRuntimeRunner(BaseRunner):
    """Polygraphy-compatible runner over a saved (already optimized) engine."""

    def __init__(self, path: Path, target: OnnxRuntimeTarget, threads: int | None = None,
                 spin: bool = True, name=None):
        super().__init__(name=name or target.id, prefix="ort-runner")
        self.path, self.target, self.threads, self.spin = Path(path), target, threads, spin

    def activate_impl(self):
        import onnxruntime as ort

        self.session = _session(
            self.path, self.target, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, self.threads, None,
            self.spin,
        )
        self._outputs = [o.name for o in self.session.get_outputs()]

    def get_input_metadata_impl(self):
        from polygraphy.common import TensorMetadata
        from polygraphy.datatype import DataType

        meta = TensorMetadata()
        for node in self.session.get_inputs():
            meta.add(node.name, dtype=DataType.from_dtype(node.type, "onnxruntime"), shape=node.shape)
        return meta

    def infer_impl(self, feed_dict):
        start = time.perf_counter()
        values = self.session.run(self._outputs, feed_dict)
        self.inference_time = time.perf_counter() - start
        return OrderedDict(zip(self._outputs, values))

    def deactivate_impl(self):
        del self.session


def _gpu(build_meta: dict) -> bool:
    providers = build_meta.get("providers") or []
    return bool(providers and providers[0] != _PROVIDER["cpu"])


def _triton_optimization(policy, max_batch: int, opt_batch: int | None, inputs: list) -> None:
    # The engine is already ORT's optimized graph, validated as is: level 2 tells Triton's
    # ONNX Runtime backend to disable graph optimization so it serves exactly that graph.
    policy.graph.level = 2


TRITON = TritonModel("onnxruntime_onnx", "model.onnx", gpu=_gpu, optimization=_triton_optimization)


def open(engine_path: Path, target: OnnxRuntimeTarget, recipe: Recipe, *,  # noqa: A001
         threads: int | None = None, spin: bool = True) -> OnnxRuntimeRunner:
    return OnnxRuntimeRunner(engine_path, target, threads, spin)
