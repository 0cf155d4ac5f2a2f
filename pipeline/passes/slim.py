"""onnxslim: constant folding, dead code and redundant-node elimination, small fusions."""

from __future__ import annotations


def onnxslim(model, skip_fusion_patterns: list[str] | None = None):
    import onnxslim as slim

    kwargs = {"skip_fusion_patterns": list(skip_fusion_patterns)} if skip_fusion_patterns else {}
    return slim.slim(model, **kwargs)
