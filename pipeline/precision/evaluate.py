"""Run a graph in ONNX Runtime on feeds and compare it with reference outputs.

Used to check a typed graph against the FP32 graph it came from (parity) and to measure
the effect of quantizing nodes (sensitivity). Sessions use ORT's default optimization, so
Q/DQ graphs run the integer kernels they will run as engines.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.core.json_object import JsonObject
from pipeline.metrics import accuracy as metrics
from pipeline.metrics import graph_check


def run(path: Path, feeds: list[dict], outputs: list[str], fp8: bool = False) -> list[dict]:
    # ORT's default optimization (extended): Q/DQ groups run the kernels the engine will run
    return graph_check.run(str(path), feeds, outputs, optimize=True, keep_qdq=fp8)


@dataclass(frozen=True)
class Parity:
    """A graph against its reference, worst over all outputs and feeds."""

    cosine: float
    top1_agreement: float | None  # None: no output is a logit output
    nonfinite: int
    max_abs: float

    def dump(self) -> JsonObject:
        return asdict(self)


def compare(reference: list[dict], actual: list[dict], top1_outputs: list[str]) -> Parity:
    """Worst cosine and top-1 agreement over all outputs, NaN/Inf count, largest |diff|."""
    per_output = metrics.compare(reference, actual, top1_outputs)
    top1 = [m.top1_agreement for m in per_output.values() if m.top1_agreement is not None]
    return Parity(cosine=float(min(m.cosine for m in per_output.values())),
                  top1_agreement=float(min(top1)) if top1 else None,
                  nonfinite=int(sum(m.nonfinite for m in per_output.values())),
                  max_abs=float(max(m.max_abs for m in per_output.values())))


def meets(result: Parity, cosine_min: float, top1_min: float | None) -> bool:
    if not np.isfinite(result.cosine) or result.cosine < cosine_min:
        return False
    return top1_min is None or result.top1_agreement is None or result.top1_agreement >= top1_min
