"""Dynamic INT8: int8 weights (per output channel), activations quantized at run time.

ONNX Runtime's `quantize_dynamic` turns each chosen MatMul into DynamicQuantizeMatMul (the
activation's range is measured on every request, uint8 asymmetric per tensor, and the
product runs in an integer kernel), Conv into ConvInteger behind DynamicQuantizeLinear, and
the fused Attention into QAttention where ORT's kernel takes that node's inputs. It does not
take an additive attention bias, which is how the attention fusion writes a padding mask:
where that bias is exactly a key-padding mask, key_mask.py gives the node the raw mask
instead; any other such Attention is split (split_attention) into its q/k/v projection, a
MatMul quantized like the others, and a float MultiHeadAttention. `fallback: blockwise` runs
the excluded MatMuls as MatMulNBits 8-bit (blockwise) instead of float. It works on
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

from pipeline.core.errors import StageFailed


class Quantizer:
    """Same interface as qdq.Quantizer: quantize(exclude, only=None, out=None) -> path."""

    def __init__(self, recipe, pre: Path, workdir: Path, feeds: list[dict], reduce_range: bool):
        self.spec, self.pre, self.workdir, self.reduce_range = recipe.precision, pre, workdir, reduce_range
        self.count = 0
        # split_attention made the projections MatMuls: quantize those with the rest
        self.op_types = sorted(set(self.spec.op_types) | ({"MatMul"} if "Attention" in self.spec.op_types else set()))

    def __call__(self, exclude: list[str], only: list[str] | None = None,
                 out: Path | None = None) -> Path:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        self.count += 1
        out = out or self.workdir / f"trial-{self.count}.onnx"
        try:
            quantize_dynamic(
                str(self.pre), str(out), op_types_to_quantize=self.op_types,
                per_channel=self.spec.per_channel, reduce_range=self.reduce_range,
                weight_type=QuantType.QInt8, nodes_to_quantize=only, nodes_to_exclude=exclude,
                # MatMulConstBOnly: activation x activation products (attention) stay float.
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": True},
            )
        except Exception as e:  # ORT raises plain exceptions
            raise StageFailed(f"dynamic int8 quantization failed: {type(e).__name__}: {e}",
                              "exclude the node it names (precision.exclude) or drop op types") from e
        if self.spec.fallback == "blockwise" and exclude:
            blockwise(out, exclude, out)
        return out


# Weights per scale along K for `fallback: blockwise`: the probe on all-MiniLM-L6-v2 (K 384 and
# 1536) kept float's row cosines at 128 (benchmarks/results/int8-hybrid-probe-2026-12-01.md).
BLOCK = 128
# ORT's MatMulNBitsQuantizer names the node it writes <MatMul's name>_Q<bits>
BLOCKWISE_SUFFIX = "_Q8"


def blockwise(src: Path, names: list[str], out: Path) -> list[str]:
    """Of `names`, the MatMuls with a 2-D constant weight (none under nodes.MIN_CHANNELS) as
    MatMulNBits: int8 weights per BLOCK along K, activations quantized to int8 per block of each
    row at run time (accuracy_level 4, ORT's integer kernel). Writes `out`; returns the names."""
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from pipeline.precision import nodes

    model = onnx.load(str(src))
    weights = {i.name: i for i in model.graph.initializer}
    wanted = set(names)
    chosen = [n.name for n in model.graph.node if n.name in wanted and n.op_type == "MatMul"
              and n.input[1] in weights and len(weights[n.input[1]].dims) == 2]
    chosen = [n for n in chosen if n not in nodes.too_small(model, chosen)]
    if chosen:
        quantizer = MatMulNBitsQuantizer(model, bits=8, block_size=BLOCK, is_symmetric=True, accuracy_level=4,
                                         quant_format=QuantFormat.QOperator, op_types_to_quantize=("MatMul",),
                                         nodes_to_include=chosen)
        quantizer.process()
        quantizer.model.save_model_to_file(str(out))
    elif src != out:
        onnx.save(model, str(out))
    return chosen


def unquantized(path: Path, names: list[str]) -> list[str]:
    """Of `names`, the nodes still present with their float op (ORT's quantizer skipped them:
    e.g. an Attention with an attention bias, which QAttention does not take)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    present = {n.name for n in graph.node if n.op_type in ("MatMul", "Gemm", "Conv", "Attention")}
    return [n for n in names if n in present]


def split_attention(src: Path, out: Path) -> tuple[Path, list[str]]:
    """Fused Attention -> MatMul (the packed q/k/v projection) + Split + MultiHeadAttention,
    for each Attention that QAttention cannot take (it has an additive attention bias, the
    form the fusion writes for a padding mask); the MatMul is then quantized like the others.

    The fused Attention runs its projection in float: on all-MiniLM-L6-v2 (8 x 128) it was
    ~47% of the dynamic INT8 engine's kernel time; split, the 24 projections run as
    MatMulInteger and the engine took ~0.6x the time (2026-12-01, loaded 2-core EPYC, median
    of 8). MultiHeadAttention takes the bias and the attention bias as they were: the float
    graph is unchanged (row cosines 1 - 1e-13). Returns (out, names of the new MatMuls).
    """
    from onnx import helper

    from pipeline.passes.onnx_passes import pack_constant_concats

    model = onnx.load(str(src))
    pack_constant_concats(model)  # a graph optimized before the pass packed them
    initializers = {i.name for i in model.graph.initializer}
    nodes, names = [], []
    for n in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        inputs = list(n.input) + [""] * (6 - len(n.input))
        sizes = attrs.get("qkv_hidden_sizes") or []
        splittable = (n.op_type == "Attention" and n.domain == "com.microsoft" and inputs[5]
                      and not inputs[3] and not inputs[4] and not any(n.output[1:])
                      and inputs[1] in initializers and inputs[2] in initializers
                      and not attrs.get("unidirectional") and (not sizes or len(set(sizes)) == 1))
        if not splittable:
            nodes.append(n)
            continue
        qkv = f"{n.name}_qkv"
        names.append(f"{n.name}_qkv_proj")
        nodes.append(helper.make_node("MatMul", [inputs[0], inputs[1]], [qkv], name=names[-1]))
        nodes.append(helper.make_node("Split", [qkv], [f"{qkv}_q", f"{qkv}_k", f"{qkv}_v"],
                                      name=f"{n.name}_split", axis=-1, num_outputs=3))
        mha = {k: v for k, v in attrs.items() if k in ("num_heads", "scale", "mask_filter_value")}
        nodes.append(helper.make_node(
            "MultiHeadAttention", [f"{qkv}_q", f"{qkv}_k", f"{qkv}_v", inputs[2], "", inputs[5]],
            [n.output[0]], name=f"{n.name}_mha", domain="com.microsoft", **mha))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(out))
    return out, names
