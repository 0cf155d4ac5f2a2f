"""The database: this machine's measured entry, cached per device identity, and the
specified entries, looked up by name.

This machine is measured once per device identity (deps.device(): CPU model, ISA flags,
cores, GPU) and the entry is kept in $PIPELINE_CACHE_DIR/hardware.json beside bench/floor's
bandwidth.json, keyed the same way: a rerun on the same machine reads it back (and says so),
another identity (another CPU, another affinity) is measured anew; `remeasure` redoes it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from pipeline.core import deps, env
from pipeline.core.errors import InputError
from pipeline.hardware import caches, probe_compute, probe_memory, specified
from pipeline.hardware.entry import HardwareEntry, Source

THIS = "this"


@dataclass(frozen=True)
class Looked:
    """An entry and whether it was read from the cache (False: measured just now)."""

    entry: HardwareEntry
    cached: bool
    path: Path | None = None  # the cache file of a measured entry


def cache_file() -> Path:
    return env.cache_root() / "hardware.json"


def _identity() -> str:
    return json.dumps(deps.device(), sort_keys=True)


def _read_cache(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def measure() -> HardwareEntry:
    """Measure this machine now: each level's bandwidth and each data type's peak, on one
    thread and on every core this process may use."""
    from pipeline.precision import isa

    here = deps.identity()
    threads = sorted({1, max(here.cores, 1)})
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    found = caches.data_caches()
    return HardwareEntry(
        name=THIS, title=here.cpu, kind="cpu", provenance="measured",
        source=Source(document="pipeline/hardware/probe_memory.py, probe_compute.py",
                      date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      notes=f"1-minute load average {load:.2f} when measured (other processes slow "
                            f"figures down, never up); caches from "
                            f"{'/sys' if all(c.source == '/sys' for c in found) else 'partly assumed sizes'}"),
        cores=here.cores, bandwidth=probe_memory.measure(found, threads),
        peaks=probe_compute.measure(isa.cpu_flags(), threads),
        runtimes=["CPUExecutionProvider"], device=deps.device())


def this_machine_cached() -> bool:
    """Whether this machine's identity has an entry in the cache (a quick look, no parse)."""
    return _identity() in _read_cache(cache_file())


def this_machine(remeasure: bool = False) -> Looked:
    """This machine's entry: from the cache when its identity is there, else measured and
    cached (a read-only cache folder: measured again next time)."""
    from pipeline.core import safe_files

    path, identity = cache_file(), _identity()
    cached = _read_cache(path)
    if not remeasure and identity in cached:
        try:
            return Looked(HardwareEntry.model_validate(cached[identity]), True, path)
        except ValidationError:
            pass  # another version's shape: measured again below
    entry = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        safe_files.write_atomic(path, json.dumps({**cached, identity: entry.model_dump(mode="json")}, indent=1))
    except OSError:
        pass
    return Looked(entry, False, path)


def names() -> list[str]:
    return [THIS, *(e.name for e in specified.entries())]


def lookup(name: str, remeasure: bool = False) -> Looked:
    """`this` (measured, cached) or a specified device by name."""
    if name.lower() == THIS:
        return this_machine(remeasure)
    entry = specified.lookup(name)
    if entry is None:
        raise InputError(f"no hardware entry `{name}`", f"use one of: {', '.join(names())}")
    return Looked(entry, False)
