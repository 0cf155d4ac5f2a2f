"""Optional dependencies, tool versions and the device, found without importing them.

Versions come from package metadata and the device from /proc and `nvidia-smi`, so the
cache keys of every stage can be computed (and an unchanged rerun skipped) without paying
for `import torch`.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass, replace

from pipeline.core.errors import DependencyError
from pipeline.core.json_object import JsonObject

Versions = dict[str, str | None]  # distribution -> its installed version (None: not installed)

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


def versions() -> Versions:
    """Versions of every tool whose output can change an artifact."""
    return {name: version(name) for name in _DISTRIBUTIONS}


# The CPU features that decide how fast an engine runs: INT8 GEMMs take VNNI or AMX where
# present and fall back to AVX2 otherwise (1.87x vs ~1.3x for one recipe on two "AMD EPYC"s).
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8")

# Tests (and only tests) simulate another machine: a JSON object whose keys replace those of
# device(), e.g. PIPELINE_DEVICE_OVERRIDE='{"cpu_isa": ["avx2"]}'. Read here and nowhere else.
DEVICE_OVERRIDE = "PIPELINE_DEVICE_OVERRIDE"


@functools.cache
def _cpuinfo() -> tuple[str | None, tuple[str, ...]]:
    """(model name, the ISA_FLAGS present) from /proc/cpuinfo's first processor."""
    name, flags = None, ()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and name is None:
                    name = value.strip()
                elif key == "flags" and not flags:
                    present = set(value.split())
                    flags = tuple(flag for flag in ISA_FLAGS if flag in present)
                if name is not None and flags:
                    break
    except OSError:
        pass
    return name, flags


def cpu_name() -> str:
    return _cpuinfo()[0] or platform.processor() or platform.machine()


def cores() -> int:
    """The cores this process may run on (a container's or taskset's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@functools.cache
def _nvidia_smi() -> tuple[tuple[str, str, str], ...]:
    """(name, compute capability, driver version) of each NVIDIA GPU; () without a driver."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    rows = [tuple(part.strip() for part in line.split(",")) for line in out.splitlines()]
    return tuple((r[0], r[1], r[2]) for r in rows if len(r) == 3)


def gpus() -> tuple[tuple[str, str], ...]:
    """(name, compute capability) of each NVIDIA GPU, from nvidia-smi; () without a driver."""
    return tuple((name, cc) for name, cc, _ in _nvidia_smi())


CPU_KEYS = ("cpu", "cpu_isa", "cores")
GPU_KEYS = ("gpu", "compute_capability", "gpu_driver")


@dataclass(frozen=True)
class DeviceIdentity:
    """What decides an engine's speed on this machine (the first GPU when there are several);
    its dump is the `device` block of manifests, reports and cache keys, in this order."""

    cpu: str
    cpu_isa: list[str]  # the ISA_FLAGS present
    cores: int
    gpu: str | None  # None without a GPU, as the two below
    compute_capability: str | None
    gpu_driver: str | None

    def dump(self) -> JsonObject:
        return asdict(self)


@functools.cache
def identity() -> DeviceIdentity:
    """This machine's DeviceIdentity; PIPELINE_DEVICE_OVERRIDE (tests) replaces some keys."""
    first = _nvidia_smi()[0] if _nvidia_smi() else (None, None, None)
    found = DeviceIdentity(cpu=cpu_name(), cpu_isa=list(_cpuinfo()[1]), cores=cores(),
                           gpu=first[0], compute_capability=first[1], gpu_driver=first[2])
    override = os.environ.get(DEVICE_OVERRIDE)
    if override:
        try:
            replaced = json.loads(override)
        except ValueError:
            replaced = None
        keys = found.dump()
        if not isinstance(replaced, dict) or not set(replaced) <= set(keys):
            raise DependencyError(f"{DEVICE_OVERRIDE}={override!r}: not a JSON object of device keys",
                                  f"use keys among {', '.join(keys)}, or unset it (it is for tests)")
        found = replace(found, **replaced)
    return found


def device() -> JsonObject:
    """The device block of manifests and reports (identity()'s dump): cpu, cpu_isa, cores,
    gpu, compute_capability, gpu_driver."""
    return identity().dump()


def device_part(keys: tuple[str, ...]) -> JsonObject:
    """The device keys one stage's result depends on (e.g. a TensorRT build: GPU_KEYS), as
    its cache key holds them."""
    here = identity()
    return {k: getattr(here, k) for k in keys}


def device_line(device: dict) -> str:
    """The device in one line for reports, e.g. "AMD EPYC 7B13, 2 cores, avx512_vnni" or
    "..., GPU NVIDIA H200 (sm 9.0, driver 570.86)". Older records lack the newer keys."""
    parts = [str(device.get("cpu") or "unknown CPU")]
    if device.get("cores"):
        parts.append(f"{device['cores']} cores")
    isa = device.get("cpu_isa")
    if isa is not None:  # the best of the flags speaks for the rest (each implies those before)
        best = [f for f in ("amx_int8", "avx512_vnni", "avx_vnni", "avx512f", "avx2") if f in isa]
        parts.append(best[0] if best else "no AVX2")
    if device.get("gpu"):
        detail = ", ".join(x for x in (f"sm {device.get('compute_capability')}",
                                       device.get("gpu_driver") and f"driver {device['gpu_driver']}") if x)
        parts.append(f"GPU {device['gpu']} ({detail})")
    else:
        parts.append("no GPU")
    return ", ".join(parts)
