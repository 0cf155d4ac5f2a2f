"""A graph's cost on a device's roofline: per node, the time it must take at least.

Per node: compute time = FLOPs / the device's peak for the node's arithmetic type, memory
time = bytes / the memory bandwidth, and the node's floor is the larger (the bound it sits
under). The graph's floor is the sum over its nodes, which run one after another (ONNX
Runtime's sequential executor; one CUDA stream). No overlap between nodes, no launch or
framework overhead, no cache reuse across nodes: the floor ignores what would make a real
run slower and counts every byte from DRAM, so a run may beat it only where a working set
stays in cache between nodes (small models; reported as efficiency above 1).

The type a node computes in: its own (int8 for the integer ops and MatMulNBits at accuracy
level 4, which the CPU kernels run on int8 activations), except on a GPU, where MatMulNBits
computes in its activations' type and float32 matrix products may use TF32 tensor cores
(ONNX Runtime CUDA's `use_tf32`): the faster assumption, since the result is a lower bound.
A type the device has no peak for falls back to fp32's, and the fallback is listed.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.hardware.entry import HardwareEntry
from pipeline.roofline.costs import GraphCost, NodeCost

MATRIX_CATEGORIES = ("matmul/conv", "attention")


@dataclass(frozen=True)
class NodeFloor:
    cost: NodeCost
    dtype: str  # the peak used
    compute_s: float
    memory_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s > self.memory_s else "memory"


@dataclass(frozen=True)
class CategoryFloor:
    time_s: float
    compute_s: float  # of its nodes' compute times
    memory_s: float
    flops: float
    bytes: int
    nodes: int

    @property
    def bound(self) -> str:
        """Compute when the compute-bound nodes hold most of the category's floor."""
        return "compute" if self.compute_s >= self.memory_s else "memory"


@dataclass(frozen=True)
class Roofline:
    device: str
    provenance: str
    threads: int | None
    bandwidth_bytes_per_s: float
    level: str
    nodes: list[NodeFloor]
    fallbacks: tuple[str, ...]  # "int8 -> fp32: no int8 peak on <device>"

    @property
    def time_s(self) -> float:
        return sum(n.time_s for n in self.nodes)

    @property
    def compute_bound_share(self) -> float:
        total = self.time_s
        return sum(n.time_s for n in self.nodes if n.bound == "compute") / total if total else 0.0

    def by_category(self) -> dict[str, CategoryFloor]:
        out: dict[str, CategoryFloor] = {}
        for n in self.nodes:
            c = out.get(n.cost.category, CategoryFloor(0.0, 0.0, 0.0, 0.0, 0, 0))
            out[n.cost.category] = CategoryFloor(
                c.time_s + n.time_s, c.compute_s + (n.time_s if n.bound == "compute" else 0.0),
                c.memory_s + (n.time_s if n.bound == "memory" else 0.0), c.flops + n.cost.flops,
                c.bytes + n.cost.bytes, c.nodes + 1)
        return out


def _peak_dtype(cost: NodeCost, entry: HardwareEntry) -> str:
    if cost.dtype == "-":
        return "-"
    if entry.kind == "gpu":
        dtype = cost.activation_dtype if cost.op.endswith("MatMulNBits") else cost.dtype
        if dtype == "fp32" and cost.category in MATRIX_CATEGORIES and entry.peak("tf32"):
            return "tf32"
        return dtype
    return cost.dtype


def roofline(cost: GraphCost, entry: HardwareEntry, threads: int | None = None,
             level: str = "DRAM") -> Roofline:
    """Each node's floor on `entry` with at most `threads` threads (a measured entry's figures
    at that many threads; None: its best), memory at `level`'s bandwidth."""
    bandwidth = entry.memory(level, threads)  # type: ignore[arg-type]
    fp32 = entry.peak("fp32", threads)
    fallbacks, nodes = set(), []
    for c in cost.nodes:
        dtype = _peak_dtype(c, entry)
        peak = entry.peak(dtype, threads) if dtype != "-" else None
        if dtype != "-" and peak is None:
            fallbacks.add(f"{dtype} -> fp32: {entry.name} has no {dtype} peak")
            peak, dtype = fp32, "fp32"
        compute = c.flops / peak.ops_per_s if peak is not None and c.flops else 0.0
        nodes.append(NodeFloor(c, dtype, compute, c.bytes / bandwidth.bytes_per_s))
    return Roofline(entry.name, entry.provenance, threads, bandwidth.bytes_per_s, bandwidth.level, nodes,
                    tuple(sorted(fallbacks)))
