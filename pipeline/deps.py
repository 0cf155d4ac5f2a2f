"""Optional dependencies, tool versions and the device, found without importing them.

Versions come from package metadata and the device from /proc and `nvidia-smi`, so the
cache keys of every stage can be computed (and an unchanged rerun skipped) without paying
for `import torch`.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import platform
import shutil
import subprocess

from pipeline.errors import DependencyError

# import name -> distribution names that provide it (first installed one wins)
_DISTRIBUTIONS = {
    "torch": ("torch",),
    "onnx": ("onnx",),
    "onnxscript": ("onnxscript",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "tensorrt": ("tensorrt", "tensorrt-cu13", "tensorrt-cu12"),
    "polygraphy": ("polygraphy",),
    "onnxslim": ("onnxslim",),
    "transformers": ("transformers",),
    "pipeline": ("engine-pipeline",),
}

_INSTALL_HINTS = {
    "tensorrt": "TensorRT needs an NVIDIA GPU; install the `gpu` extra (pip install -e '.[gpu]') "
    "with NVIDIA's package index configured",
    "transformers": "install the `hf` extra (pip install -e '.[hf]')",
    "onnxruntime": "install the `cpu` extra (pip install -e '.[cpu]') or `gpu` on CUDA machines",
}


@functools.cache
def version(module: str) -> str | None:
    """Installed version of `module` (import name), or None when it is not installed."""
    for dist in _DISTRIBUTIONS.get(module, (module,)):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@functools.cache
def has(module: str) -> bool:
    """True when `module` can be imported (its top-level package is found)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, why: str) -> None:
    """Raise a DependencyError naming the package and how to install it."""
    if not has(module):
        hint = _INSTALL_HINTS.get(module, f"pip install {module}")
        raise DependencyError(f"{why} needs `{module}`, which is not installed", hint)


def install_hint(module: str) -> str:
    return _INSTALL_HINTS.get(module, f"pip install {module}")


def versions() -> dict[str, str | None]:
    """Versions of every tool whose output can change an artifact."""
    return {name: version(name) for name in _DISTRIBUTIONS}


@functools.cache
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def gpus() -> tuple[tuple[str, str], ...]:
    """(name, compute capability) of each NVIDIA GPU, from nvidia-smi; () without a driver."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    rows = [tuple(part.strip() for part in line.split(",", 1)) for line in out.splitlines()]
    return tuple((r[0], r[1]) for r in rows if len(r) == 2)


def device() -> dict[str, str | None]:
    """The device block of manifests and reports (first GPU when there are several)."""
    first = gpus()[0] if gpus() else (None, None)
    return {"cpu": cpu_name(), "gpu": first[0], "compute_capability": first[1]}
