"""AOTInductor target: torch.export + aoti_compile_and_package -> a self-contained .pt2.

The engine is compiled from the PyTorch model itself (not from the ONNX graph), with the
recipe's dynamic dims, and loaded with `torch._inductor.aoti_load_package`: serving it
needs torch but none of the model's Python code.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
from polygraphy.backend.base import BaseRunner

from pipeline.core import deps
from pipeline.recipe import AOTInductorTarget, Recipe

TARGET = AOTInductorTarget
EXTENSION = ".pt2"
NEEDS_ONNX = False  # compiled from the PyTorch program (torch.export), never from the graph
PLAIN_ONNX = False
ENGINE_IS_ONNX = False
TRITON = None  # Triton has no platform for AOTInductor packages: deploy refuses them


def device(target: AOTInductorTarget) -> str:
    if target.device == "auto":
        return "cuda" if deps.gpus() else "cpu"
    return target.device


def unavailable(target: AOTInductorTarget) -> str | None:
    where = device(target)
    if where == "cuda" and not deps.gpus():
        return "device `cuda` needs an NVIDIA GPU; none was found (nvidia-smi)"
    if where == "cpu" and not (shutil.which("c++") or shutil.which("g++")):
        return "AOTInductor on CPU compiles C++: no c++/g++ compiler on PATH (apt-get install g++)"
    return None


def build(onnx_path: Path, target: AOTInductorTarget, recipe: Recipe, workdir: Path):
    """`onnx_path` is unused: AOTInductor compiles the PyTorch program directly."""
    import torch

    from pipeline import data
    from pipeline.backends.torch import torch_dtype
    from pipeline.model import sources as models
    from pipeline.model.shapes import dynamic_shapes

    where = device(target)
    model = models.load(recipe).to(device=where, dtype=torch_dtype(target.dtype))
    example = data.feeds(recipe, "export")[0]
    args = []
    for spec in recipe.inputs:
        t = torch.from_numpy(example[spec.name]).to(where)
        args.append(t.to(torch_dtype(target.dtype)) if t.is_floating_point() else t)
    t0 = time.perf_counter()
    with torch.no_grad(), _attention_for_export(where):
        program = torch.export.export(model, tuple(args), dynamic_shapes=dynamic_shapes(recipe))
        export_seconds = time.perf_counter() - t0
        engine = workdir / f"{target.id}{EXTENSION}"
        t0 = time.perf_counter()
        torch._inductor.aoti_compile_and_package(program, package_path=str(engine))
    return engine, {
        "device": where,
        "dtype": target.dtype,
        "torch": torch.__version__,
        "export_seconds": export_seconds,
        "build_seconds": time.perf_counter() - t0,
    }


def _attention_for_export(where: str):
    """On CUDA, SDPA with an explicit mask (the sparse attention patterns) takes the
    memory-efficient kernel, whose mask alignment adds `sequence % 8` guards that torch.export
    rejects for a dynamic sequence (pytorch#124502, open). Flash attention (no mask) and the
    math path export cleanly; the CPU kernels have no such step."""
    if where != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])


class AOTInductorRunner(BaseRunner):
    """Runs a .pt2 package: numpy feeds by input name -> numpy outputs by output name."""

    def __init__(self, path: Path, target: AOTInductorTarget, input_names: list[str],
                 output_names: list[str], threads: int | None = None, host_outputs: bool = True):
        super().__init__(name=target.id, prefix="aoti-runner")
        self.path, self.target, self.threads = Path(path), target, threads
        self.input_names, self.output_names = input_names, output_names
        self.host_outputs = host_outputs  # False: device tensors after a sync (backends.torch)

    def activate_impl(self):
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
        self._torch = torch
        self.device = device(self.target)
        self.package = torch._inductor.aoti_load_package(str(self.path))

    def get_input_metadata_impl(self):
        from polygraphy.common import TensorMetadata

        return TensorMetadata()

    def infer_impl(self, feed_dict):
        from pipeline.backends.torch import finish, torch_dtype

        torch = self._torch
        start = time.perf_counter()
        args = []
        for name in self.input_names:
            t = torch.from_numpy(np.ascontiguousarray(feed_dict[name])).to(self.device)
            args.append(t.to(torch_dtype(self.target.dtype)) if t.is_floating_point() else t)
        with torch.inference_mode():
            out = finish(self.package(*args), self.output_names, self.host_outputs)
        self.inference_time = time.perf_counter() - start
        return OrderedDict(out)

    def deactivate_impl(self):
        del self.package


def open(engine_path: Path, target: AOTInductorTarget, recipe: Recipe, *,  # noqa: A001
         threads: int | None = None, spin: bool = True, host_outputs: bool = True) -> AOTInductorRunner:
    return AOTInductorRunner(engine_path, target, [i.name for i in recipe.inputs], recipe.outputs,
                             threads, host_outputs)
