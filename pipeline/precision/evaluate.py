"""Run a graph in ONNX Runtime on feeds and compare it with reference outputs.

Used to check a typed graph against the FP32 graph it came from (parity) and to measure
the effect of quantizing nodes (sensitivity). Sessions use ORT's default optimization, so
Q/DQ graphs run the integer kernels they will run as engines.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline import metrics


def session(path: Path, fp8: bool = False, level: str = "extended"):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    }[level]
    if fp8:
        # The CPU provider has no FP8 kernels for fused QDQ groups; keep Q/DQ as they are
        # (emulated FP8: quantize, dequantize, float op).
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run(path: Path, feeds: list[dict], outputs: list[str], fp8: bool = False) -> list[dict]:
    sess = session(path, fp8)
    return [dict(zip(outputs, sess.run(outputs, f))) for f in feeds]


def compare(reference: list[dict], actual: list[dict], top1_outputs: list[str]) -> dict:
    """Worst cosine and top-1 agreement over all outputs (plus the per-output metrics)."""
    per_output = metrics.compare(reference, actual, top1_outputs)
    top1 = [m["top1_agreement"] for m in per_output.values() if m["top1_agreement"] is not None]
    return {
        "cosine": float(min(m["cosine"] for m in per_output.values())),
        "top1_agreement": float(min(top1)) if top1 else None,
        "nonfinite": int(sum(m["nonfinite"] for m in per_output.values())),
        "max_abs": float(max(m["max_abs"] for m in per_output.values())),
    }


def meets(result: dict, cosine_min: float, top1_min: float | None) -> bool:
    if not np.isfinite(result["cosine"]) or result["cosine"] < cosine_min:
        return False
    return top1_min is None or result["top1_agreement"] is None or result["top1_agreement"] >= top1_min
