"""Decode against the hardware floor: the bytes one decode step must read over the memory bandwidth.

At batch 1 a decode step reads every weight once (a GEMV per MatMul) and the whole KV cache
of the context, and does little arithmetic on each byte, so on a CPU its time is bounded
below by bytes / bandwidth. Put next to the measured TPOT, that says how far an engine is
from what this machine allows, and why INT4 pays (it reads 1/8 of FP32's weight bytes) or
does not (the floor moved but the engine stayed where its overheads are).

- bandwidth: a streaming copy of a buffer much larger than the caches (numpy, one thread per
  copy as numpy does; the best of several), in bytes moved (read + write) per second;
  measured once per device identity (deps.device()) and cached under $PIPELINE_CACHE_DIR
  (default ~/.cache/engine-pipeline), since it is a property of the machine.
- bytes per step: the engine graph's initializers in their stored precision (int4 blocks,
  scales and zero points as stored), as a session holds them (model/compact_storage.py: the
  file's fp16-stored scales count as the float32 the step reads), each read once, except a table read only by Gather (the
  token embedding reads one row per token); plus the KV cache at that context
  (kv bytes per token x context), read by attention.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.artifacts.generation import DecodeFloor, FloorPoint
from pipeline.core import deps, env
from pipeline.core.json_object import JsonObject
from pipeline.model import compact_storage

FloorPoints = dict[str, FloorPoint]  # workload point label -> its decode floor

COPY_MB = 256  # >> any last-level cache here; 2 x 256 MB live while measuring
REPEATS = 5


def _cache_file() -> Path:
    return env.cache_root() / "bandwidth.json"


def measure_bandwidth(megabytes: int = COPY_MB, repeats: int = REPEATS) -> float:
    """Bytes per second of a streaming copy (read + write counted), best of `repeats`."""
    import numpy as np

    src = np.ones(megabytes * 2**20 // 8, np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch every page first: no page faults in the timed copies
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


@dataclass(frozen=True)
class Bandwidth:
    """This machine's memory bandwidth: bytes/s, how and when it was measured."""

    bytes_per_s: float
    method: str
    measured: str

    def dump(self) -> JsonObject:
        return asdict(self)


def bandwidth() -> Bandwidth:
    """Cached per device identity (one measurement)."""
    identity = json.dumps(deps.device(), sort_keys=True)
    path = _cache_file()
    try:
        cached = json.loads(path.read_text())
        if isinstance(cached, dict) and identity in cached and cached[identity]["bytes_per_s"] > 0:
            return Bandwidth(**cached[identity])
    except (OSError, ValueError, KeyError, TypeError):
        cached = {}
    entry = Bandwidth(bytes_per_s=measure_bandwidth(),
                      method=f"numpy streaming copy of {COPY_MB} MiB, best of {REPEATS}, read + write bytes",
                      measured=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    try:
        from pipeline.core import safe_files

        path.parent.mkdir(parents=True, exist_ok=True)
        # an exclusive temp under a random name, renamed into place: no fixed name to plant
        safe_files.write_atomic(path, json.dumps({**(cached if isinstance(cached, dict) else {}),
                                                  identity: entry.dump()}))
    except OSError:
        pass  # a read-only home: measured again next time
    return entry


@dataclass(frozen=True)
class WeightBytes:
    """Initializer bytes a decode step reads (`total`), the Gather-only tables' whole size,
    and the total by dtype."""

    total: int
    gather_tables: int
    by_dtype: dict[str, int]


def weight_bytes(onnx_path: Path) -> WeightBytes:
    """A table only a Gather reads (the embedding, or its 8-bit rows and their scales under
    GatherBlockQuantized) counts one row (the token's), not its whole size."""
    import numpy as np
    import onnx
    from onnx import helper

    model = compact_storage.load(onnx_path)  # as a session holds it: fp16-stored tables as float32
    graph = model.graph
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    total, gathered, by_dtype = 0, 0, {}
    for init in graph.initializer:
        bits = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4}.get(init.data_type)
        if bits is None:
            bits = 8 * np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        count = int(np.prod(init.dims)) if init.dims else 1
        size = (count * bits + 7) // 8
        if readers.get(init.name) in ({"Gather"}, {"GatherBlockQuantized"}) and len(init.dims) >= 2:
            gathered += size
            size //= max(int(init.dims[0]), 1)  # one row per token
        total += size
        name = helper.tensor_dtype_to_string(init.data_type).removeprefix("TensorProto.").lower()
        by_dtype[name] = by_dtype.get(name, 0) + size
    return WeightBytes(total=total, gather_tables=gathered, by_dtype=by_dtype)


def decode_floor(onnx_path: Path, kv_bytes_per_token: int, contexts: dict[str, int],
                 tpot_ms: dict[str, float] | None = None) -> DecodeFloor:
    """The generation section's `floor`: per point (its context), bytes per decode step, the
    floor in ms at the measured bandwidth, and the measured TPOT over it where given."""
    bw = bandwidth()
    weights = weight_bytes(onnx_path)
    return DecodeFloor(
        bandwidth_gb_s=bw.bytes_per_s / 1e9, bandwidth_method=bw.method,
        bandwidth_measured=bw.measured,
        weights_bytes=weights.total, weights_by_dtype=weights.by_dtype,
        gather_table_bytes=weights.gather_tables, kv_bytes_per_token=kv_bytes_per_token,
        points=floor_points(weights.total, kv_bytes_per_token, contexts, bw.bytes_per_s, tpot_ms))


def floor_points(weights: int, kv_bytes_per_token: int, contexts: dict[str, int], rate: float,
                 tpot_ms: dict[str, float] | None = None) -> FloorPoints:
    """Per point (its context): the bytes one decode step reads, the floor in ms at `rate`
    bytes/s, and the measured TPOT over it where given."""
    # Bytes a decode step *reads*; a copy moves each byte twice (read + write), so the
    # copy's rate is the read rate a GEMV can reach, at best.
    points = {}
    for name, context in contexts.items():
        step = weights + kv_bytes_per_token * context
        floor_ms = step / rate * 1e3
        measured = {}
        if tpot_ms and tpot_ms.get(name):
            measured = {"tpot_ms": tpot_ms[name], "tpot_over_floor": tpot_ms[name] / floor_ms}
        points[name] = FloorPoint(context=context, bytes=step, floor_ms=floor_ms, **measured)
    return points
