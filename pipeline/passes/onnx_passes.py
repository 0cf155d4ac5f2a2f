"""Passes built on onnx and onnxscript: shape inference, folding, rewrites, ORT fusions.

Each takes and returns an onnx.ModelProto (see pipeline/passes/__init__.py). onnxscript's
passes work on its IR; the conversion both ways is lossless for what the exporters produce.
"""

from __future__ import annotations


def _ir(model):
    import onnx_ir as ir

    return ir, ir.from_proto(model)


def shape_inference(model):
    import onnx

    # data_prop propagates Shape -> Gather -> Concat values, so reshapes get static ranks.
    return onnx.shape_inference.infer_shapes(model, check_type=True, data_prop=True)


def fold_constants(model, input_size_limit: int = 8192):
    """Constant folding and dead-node elimination (onnxscript.optimizer)."""
    import onnxscript

    ir, m = _ir(model)
    onnxscript.optimizer.optimize(m, input_size_limit=int(input_size_limit))
    return ir.to_proto(m)


def rewrite(model):
    """onnxscript's default rewrite rules (e.g. cast/reshape/transpose simplifications)."""
    import onnxscript

    ir, m = _ir(model)
    onnxscript.rewriter.rewrite(m)
    return ir.to_proto(m)


def ort_fusions(model):
    """Fusions for ONNX Runtime: SDPA -> (Multi-Head) Attention, (Skip) LayerNorm/RMSNorm,
    GELU / BiasGelu, rotary embedding. Returns the fusion counts onnxscript reports."""
    from onnxscript.rewriter import ort_fusions as fusions

    ir, m = _ir(model)
    m, counts = fusions.optimize_for_ort(m)
    return ir.to_proto(m), {"rules_applied": {k: v for k, v in counts.items() if v}}
