"""One device's entry in the hardware feature database, typed.

An entry is either `measured` here (pipeline/hardware/probe_*.py, cached per device
identity) or `specified`: copied from its maker's published documents, with the document,
its address and date. A specified figure is what the maker promises at best (dense, no
sparsity, boost clocks), so any time computed from it is a lower bound, never an estimate.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Provenance = Literal["measured", "specified"]
# Arithmetic types an entry may hold a peak for. tf32: NVIDIA's tensor-core math for float32
# matrix products (10-bit mantissa), a mode of the runtime, not a storage type.
DType = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4"]
Level = Literal["L1", "L2", "L3", "DRAM"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Source(_Frozen):
    """Where an entry's figures come from."""

    document: str = Field(description="The document's title, or the measuring code for `measured`.")
    url: str | None = Field(None, description="Its address, where it has one.")
    date: str = Field(description="The document's date, or when the figures were measured (ISO-8601).")
    notes: str = Field("", description="How figures were derived from it (dense from sparse, ...).")


class Bandwidth(_Frozen):
    """Streaming bandwidth at one memory level: bytes read plus bytes written per second."""

    level: Level
    bytes_per_s: float = Field(gt=0)
    capacity_bytes: int | None = Field(None, description="The level's size (per core for L1/L2).")
    working_set_bytes: int | None = Field(None, description="Bytes the measurement streamed over.")
    threads: int | None = Field(None, description="Threads streaming at once (measured), None: the whole device.")
    method: str = ""


class Peak(_Frozen):
    """Peak arithmetic for one data type: operations (a multiply and an add count two) per
    second, and the instruction set or unit that produced it; `ops_per_s` None: not present."""

    dtype: DType
    ops_per_s: float | None = Field(None, gt=0)
    isa: str = Field(description="Instruction set / unit, e.g. `AVX-512 VNNI (vpdpbusd)`, `Tensor Cores`.")
    threads: int | None = None
    method: str = ""
    note: str = ""

    @property
    def present(self) -> bool:
        return self.ops_per_s is not None


class HardwareEntry(_Frozen):
    """A device: its memory levels and peaks, how many cores (threads) gave them, where from."""

    name: str = Field(description="Short key, e.g. `h100`, `this`.")
    title: str = Field(description="The device as its maker names it.")
    kind: Literal["cpu", "gpu"]
    provenance: Provenance
    source: Source
    cores: int | None = Field(None, description="CPU cores (measured: this process's affinity) or GPU SMs.")
    memory_bytes: int | None = Field(None, description="Device memory (GPU) or None.")
    bandwidth: list[Bandwidth]
    peaks: list[Peak]
    runtimes: list[str] = Field(description="Execution providers that run on it, e.g. CPUExecutionProvider.")
    device: dict[str, object] | None = Field(None, description="deps.device() of a measured entry.")

    def memory(self, level: Level = "DRAM", threads: int | None = None) -> Bandwidth:
        """The level's best figure with at most `threads` threads (any when None); the
        outermost level measured when `level` is absent."""
        rows = [b for b in self.bandwidth if b.level == level] or [self.bandwidth[-1]]
        return _best_for_threads(rows, threads)

    def peak(self, dtype: str, threads: int | None = None) -> Peak | None:
        """The best present peak for `dtype` with at most `threads` threads; None if absent."""
        rows = [p for p in self.peaks if p.dtype == dtype and p.present]
        return _best_for_threads(rows, threads) if rows else None


def _best_for_threads(rows: list, threads: int | None):
    """Of rows measured at several thread counts, the fastest with at most `threads` threads:
    an engine on N threads may always use fewer, so a floor takes the best of them (and a
    busy machine's noisy 2-thread figure below its 1-thread one never lowers the bound). A
    specified row (threads None) stands for the whole device."""
    fits = [r for r in rows if threads is None or r.threads is None or r.threads <= threads]
    return max(fits or rows, key=lambda r: r.bytes_per_s if isinstance(r, Bandwidth) else (r.ops_per_s or 0))
