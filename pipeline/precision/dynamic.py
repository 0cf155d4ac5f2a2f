"""Dynamic INT8: int8 weights (per output channel), activations quantized at run time.

ONNX Runtime's `quantize_dynamic` turns each chosen MatMul into DynamicQuantizeMatMul (the
activation's range is measured on every request, uint8 asymmetric per tensor, and the
product runs in an integer kernel), Conv into ConvInteger behind DynamicQuantizeLinear, and
the fused Attention into QAttention where ORT's kernel takes that node's inputs (it does not
take an additive attention bias: such nodes stay float and the report says so). It works on
the optimize stage's fused graph when told the element type of tensors it cannot infer
(`DefaultTensorType`: the fused contrib ops have no ONNX shape inference); Optimum's
quantizer, which lacks that option, refuses such graphs.

No calibration is needed; per-tensor run-time ranges are what make dynamic INT8 lose
accuracy on activations with outlier channels, which `precision.smoothing` addresses.
TensorRT does not build these ops: a recipe with a TensorRT target must use scheme static
(the recipe check says so).
"""

from __future__ import annotations

from pathlib import Path

import onnx

from pipeline.errors import StageFailed


class Quantizer:
    """Same interface as qdq.Quantizer: quantize(exclude, only=None, out=None) -> path."""

    def __init__(self, recipe, pre: Path, workdir: Path, feeds: list[dict], reduce_range: bool):
        self.spec, self.pre, self.workdir, self.reduce_range = recipe.precision, pre, workdir, reduce_range
        self.count = 0

    def __call__(self, exclude: list[str], only: list[str] | None = None,
                 out: Path | None = None) -> Path:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        self.count += 1
        out = out or self.workdir / f"trial-{self.count}.onnx"
        try:
            quantize_dynamic(
                str(self.pre), str(out), op_types_to_quantize=list(self.spec.op_types),
                per_channel=self.spec.per_channel, reduce_range=self.reduce_range,
                weight_type=QuantType.QInt8, nodes_to_quantize=only, nodes_to_exclude=exclude,
                # MatMulConstBOnly: activation x activation products (attention) stay float.
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": True},
            )
        except Exception as e:  # ORT raises plain exceptions
            raise StageFailed(f"dynamic int8 quantization failed: {type(e).__name__}: {e}",
                              "exclude the node it names (precision.exclude) or drop op types") from e
        return out


def unquantized(path: Path, names: list[str]) -> list[str]:
    """Of `names`, the nodes still present with their float op (ORT's quantizer skipped them:
    e.g. an Attention with an attention bias, which QAttention does not take)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    present = {n.name for n in graph.node if n.op_type in ("MatMul", "Gemm", "Conv", "Attention")}
    return [n for n in names if n in present]
