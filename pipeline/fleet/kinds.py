"""Device kinds: the name of what an engine is built for, and the Ray resource that places it.

A kind is read from the device identity the stage cache already records (deps.device()):
a machine with an NVIDIA GPU is `gpu-<model>` (e.g. `gpu-nvidia-h200`: a TensorRT plan is
valid on that model only); any other is `cpu-<best ISA>` (e.g. `cpu-avx512_vnni`,
`cpu-avx2`: INT8 speed follows the instruction set). A node advertises its one kind as the
Ray custom resource `device:<kind>` with 1 unit, so a node runs one fleet job at a time:
two builds timing on the same cores would disturb each other's latencies.
"""

from __future__ import annotations

import json
import re
import shlex

from pipeline.core import deps

PREFIX = "device:"
# Best first: each of these implies the ones after it on the CPUs that matter here.
_ISA_ORDER = ("amx_int8", "avx512_vnni", "avx_vnni", "avx512f", "avx2")
_KIND = re.compile(r"(cpu|gpu)-[a-z0-9_.-]+")


def slug(text: str) -> str:
    """`NVIDIA H200` -> `nvidia-h200`: lower case, runs of other characters as one dash."""
    return re.sub(r"[^a-z0-9_.]+", "-", text.lower()).strip("-") or "unknown"


def kind_of(device: dict) -> str:
    """The kind of a device block (deps.device(), or a report's / manifest's `device`)."""
    if device.get("gpu"):
        return f"gpu-{slug(str(device['gpu']))}"
    isa = device.get("cpu_isa") or []
    best = next((flag for flag in _ISA_ORDER if flag in isa), "base")
    return f"cpu-{best}"


def here() -> str:
    """This machine's kind (PIPELINE_DEVICE_OVERRIDE, for tests, simulates another)."""
    return kind_of(deps.device())


def resource(kind: str) -> str:
    """The Ray custom resource a node of this kind advertises: `device:<kind>`."""
    return PREFIX + kind


def problem(kind: str) -> str | None:
    """Why `kind` is not a kind name (None when it is one)."""
    if _KIND.fullmatch(kind):
        return None
    return (f"device kind {kind!r} is not `cpu-<isa>` or `gpu-<model>` (lower case, e.g. "
            "cpu-avx512_vnni, cpu-avx2, gpu-nvidia-h200)")


def kinds_of(resources: dict) -> list[str]:
    """The kinds a node's (or the cluster's) Ray resources advertise."""
    return sorted(name[len(PREFIX):] for name in resources if name.startswith(PREFIX))


def start_command(kind: str, address: str | None) -> list[str]:
    """`ray start` for a node of this kind: the head (no address) or a worker joining one."""
    where = [f"--address={address}"] if address else ["--head", "--include-dashboard=false"]
    return ["ray", "start", *where, f"--resources={json.dumps({resource(kind): 1})}"]


def start_line(kind: str, address: str | None) -> str:
    return shlex.join(start_command(kind, address))
