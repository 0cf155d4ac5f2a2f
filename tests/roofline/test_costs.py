"""Per-node cost on tiny hand-built graphs, each figure computed by hand beside it; the
roofline of a node on an entry; which ops a runtime lacks."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), ms_opset=True) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.microsoft", 1)] if ms_opset else [])
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=opsets)


def _cost(model, **dims):
    from pipeline.roofline import costs, shapes

    return costs.graph_cost(shapes.skeleton(model), dims)


def _vi(name, shape, elem=F32):
    return helper.make_tensor_value_info(name, elem, shape)


def test_matmul_with_a_symbolic_batch_counts_2mkn_and_its_bytes():
    w = numpy_helper.from_array(np.ones((4, 5), np.float32), "w")
    cost = _cost(_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", ["batch", 3, 4])],
                        [_vi("y", ["batch", 3, 5])], [w]), batch=2)
    (node,) = cost.nodes
    assert node.flops == 2 * (2 * 3) * 4 * 5  # 2 x M (batch x rows) x K x N = 240
    assert node.bytes_read == 2 * 3 * 4 * 4 + 4 * 5 * 4 and node.bytes_written == 2 * 3 * 5 * 4
    assert node.dtype == "fp32" and node.category == "matmul/conv" and cost.unknown == 0


def test_gemm_transposed_and_conv_with_groups():
    b = numpy_helper.from_array(np.ones((5, 4), np.float32), "b")
    gemm = _cost(_model([helper.make_node("Gemm", ["a", "b"], ["y"], transB=1)], [_vi("a", [3, 4])],
                        [_vi("y", [3, 5])], [b]))
    assert gemm.nodes[0].flops == 2 * 3 * 4 * 5
    for group, w_shape, per_output in ((1, (4, 2, 3, 3), 2 * 3 * 3), (2, (4, 1, 3, 3), 1 * 3 * 3)):
        w = numpy_helper.from_array(np.ones(w_shape, np.float32), "w")
        conv = _cost(_model([helper.make_node("Conv", ["x", "w"], ["y"], group=group)], [_vi("x", [1, 2, 5, 5])],
                            [_vi("y", [1, 4, 3, 3])], [w]))
        assert conv.nodes[0].flops == 2 * (4 * 3 * 3) * per_output  # 1296, then 648


def test_matmulnbits_counts_its_weights_at_4_bits_and_computes_in_int8_at_level_4():
    k, n, block = 64, 32, 32
    blocks = k // block
    packed = numpy_helper.from_array(np.zeros((n, blocks, block * 4 // 8), np.uint8), "B")  # 1,024 bytes
    scales = numpy_helper.from_array(np.ones(n * blocks, np.float32), "scales")  # 256 bytes
    zeros = numpy_helper.from_array(np.zeros(n * 1, np.uint8), "zp")  # 2 blocks x 4 bits per row: 1 byte
    node = helper.make_node("MatMulNBits", ["a", "B", "scales", "zp"], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block, accuracy_level=4)
    cost = _cost(_model([node], [_vi("a", [1, "sequence", k])], [_vi("y", [1, "sequence", n])],
                        [packed, scales, zeros]), sequence=7)
    (c,) = cost.nodes
    assert c.flops == 2 * 7 * k * n and c.dtype == "int8" and c.activation_dtype == "fp32"
    assert c.bytes_read == 7 * k * 4 + 1024 + 256 + 32 and c.bytes_written == 7 * n * 4
    assert c.op == "com.microsoft.MatMulNBits"


def test_group_query_attention_counts_causal_pairs_and_writes_only_the_new_rows():
    heads, kv_heads, hd, new, past = 2, 1, 8, 3, 5
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens", "total"],
                            ["out", "present_k", "present_v"], domain="com.microsoft",
                            num_heads=heads, kv_num_heads=kv_heads)
    inputs = [_vi("q", [1, "sequence", heads * hd]), _vi("k", [1, "sequence", kv_heads * hd]),
              _vi("v", [1, "sequence", kv_heads * hd]), _vi("pk", [1, kv_heads, "past_sequence", hd]),
              _vi("pv", [1, kv_heads, "past_sequence", hd]), _vi("seqlens", [1], TensorProto.INT32),
              _vi("total", [], TensorProto.INT32)]
    outputs = [_vi("out", [1, "sequence", heads * hd]), _vi("present_k", [1, kv_heads, "total_sequence", hd]),
               _vi("present_v", [1, kv_heads, "total_sequence", hd])]
    cost = _cost(_model([node], inputs, outputs), sequence=new, past_sequence=past, total_sequence=new + past)
    (c,) = cost.nodes
    pairs = new * past + new * (new + 1) // 2  # query i sees the past and the new tokens up to itself: 21
    assert c.flops == 4 * heads * hd * pairs  # QK^T and PV: 2 x hd each, per head and pair
    assert c.bytes_written == new * heads * hd * 4 + 2 * kv_heads * new * hd * 4  # output + new K, V rows
    past_bytes = 2 * kv_heads * past * hd * 4
    assert c.bytes_read == new * (heads + 2 * kv_heads) * hd * 4 + past_bytes + 4 + 4
    assert c.category == "attention"


def test_causal_multi_head_attention_and_the_ops_that_move_part_or_nothing():
    mha = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft",
                           num_heads=2, unidirectional=1)
    cost = _cost(_model([mha], [_vi(n, [1, 4, 16]) for n in "qkv"], [_vi("o", [1, 4, 16])]))
    assert cost.nodes[0].flops == 4 * 16 * (4 * 5 // 2)  # 4 x D x causal pairs of 4 tokens (10)
    table = numpy_helper.from_array(np.ones((100, 16), np.float32), "table")
    shape = numpy_helper.from_array(np.array([4, 16], np.int64), "shape")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"]),
             helper.make_node("Reshape", ["rows", "shape"], ["flat"]), helper.make_node("Relu", ["flat"], ["y"])]
    cost = _cost(_model(nodes, [_vi("ids", [1, 4], TensorProto.INT64)], [_vi("y", [4, 16])], [table, shape]))
    gather, reshape, relu = cost.nodes
    assert gather.bytes_read == 4 * 16 * 4 + 4 * 8  # the 4 rows it takes and the ids, not the 6,400-byte table
    assert reshape.bytes == 0 and reshape.flops == 0  # a view: ONNX Runtime aliases its input
    assert relu.flops == 0 and relu.bytes == 2 * 4 * 16 * 4 and relu.formula == "bytes only"


def test_unbound_dims_are_named():
    with pytest.raises(ValueError, match="past_sequence"):
        _cost(_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["past_sequence"])], [_vi("y", ["past_sequence"])]))


def test_shapes_flow_through_the_ops_ort_inference_misses():
    """A ReduceMax whose axes are an input (opset 18), then an Add: ORT's inference alone
    stops there; and MatMulIntegerToFloat, which it does not know."""
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    nodes = [helper.make_node("ReduceMax", ["x", "axes"], ["m"], keepdims=0), helper.make_node("Add", ["m", "m"], ["y"])]
    model = _model(nodes, [_vi("x", ["batch", 3, 4])], [_vi("y", ["batch", 3])], [axes], ms_opset=False)
    model.opset_import[0].version = 18
    reduce_max, add = _cost(model, batch=2).nodes
    assert reduce_max.unknown == 0 and add.bytes == 3 * 2 * 3 * 4  # two [2, 3] float reads, one write
    inits = [numpy_helper.from_array(np.ones((4, 3), np.int8), "b"), numpy_helper.from_array(np.ones(1, np.float32), "sa"),
             numpy_helper.from_array(np.ones(1, np.float32), "sb")]
    node = helper.make_node("MatMulIntegerToFloat", ["a", "b", "sa", "sb"], ["y"], domain="com.microsoft")
    (c,) = _cost(_model([node], [_vi("a", ["rows", 4], TensorProto.UINT8)], [_vi("y", ["rows", 3])], inits),
                 rows=2).nodes
    assert c.flops == 2 * 2 * 4 * 3 and c.dtype == "int8" and c.bytes_written == 2 * 3 * 4 and c.unknown == 0


def test_onnx_attention_opset_23_counts_causal_pairs():
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)
    inputs = [_vi(n, [1, 2, "sequence", 8]) for n in "qkv"]
    model = _model([node], inputs, [_vi("y", [1, 2, "sequence", 8])], ms_opset=False)
    model.opset_import[0].version = 23
    (c,) = _cost(model, sequence=4).nodes
    assert c.flops == 2 * 2 * (4 * 5 // 2) * (8 + 8) and c.category == "attention"  # 2 heads, 10 pairs


def test_q_attention_gets_its_output_shape_and_counts_projection_and_pairs():
    """QAttention (MiniLM's int8 attention), which ORT's inference does not know: its output's
    shape flows on to the next node, and its FLOPs are the QKV projection plus QK^T and PV."""
    b, s, h = 2, 4, 16
    weight = numpy_helper.from_array(np.ones((h, 3 * h), np.int8), "w")
    bias = numpy_helper.from_array(np.zeros(3 * h, np.float32), "bias")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "scale")
    nodes = [helper.make_node("QAttention", ["x", "w", "bias", "scale", "scale"], ["o"], domain="com.microsoft",
                              num_heads=2),
             helper.make_node("Relu", ["o"], ["y"])]
    cost = _cost(_model(nodes, [_vi("x", ["batch", "sequence", h], TensorProto.UINT8)], [_vi("y", ["batch", "sequence", h])],
                        [weight, bias, scale]), batch=b, sequence=s)
    attention, relu = cost.nodes
    assert cost.unknown == 0 and relu.bytes == 2 * b * s * h * 4  # the float output's shape is known
    assert attention.flops == 2 * b * s * h * 3 * h + 2 * b * s * s * (h + h)  # projection + full (not causal) pairs
    assert attention.dtype == "int8" and attention.category == "attention"


def test_ort_fused_matmul_and_gemm_get_shapes_and_the_nodes_after_them_too():
    """ORT's saved graphs hold com.microsoft FusedMatMul (gpt2-tiny's scaled QK^T) and
    FusedGemm (digits' Gemm + Relu), which ORT's symbolic shape inference does not know: it
    stopped there and every later value counted 0 (gpt2-tiny 192 values, digits 12)."""
    q = helper.make_node("FusedMatMul", ["q", "k"], ["s"], domain="com.microsoft", transB=1, alpha=0.25)
    after = helper.make_node("Softmax", ["s"], ["p"], axis=-1)
    cost = _cost(_model([q, after], [_vi("q", ["batch", 4, 8, 16]), _vi("k", ["batch", 4, 8, 16])],
                        [_vi("p", ["batch", 4, 8, 8])]), batch=2)
    assert cost.unknown == 0 and cost.nodes[0].flops == 2 * (2 * 4 * 8 * 8) * 16  # K^T: [.., 16, 8]
    assert cost.nodes[1].bytes == 2 * (2 * 4 * 8 * 8 * 4)  # the Softmax after it: read and written
    w = numpy_helper.from_array(np.ones((5, 4), np.float32), "w")
    gemm = helper.make_node("FusedGemm", ["a", "w"], ["h"], domain="com.microsoft", transB=1, activation="Relu")
    cost = _cost(_model([gemm, helper.make_node("Neg", ["h"], ["y"])], [_vi("a", ["batch", 4])],
                        [_vi("y", ["batch", 5])], [w]), batch=3)
    assert cost.unknown == 0 and cost.nodes[0].flops == 2 * 3 * 4 * 5 and cost.nodes[1].bytes == 2 * 3 * 5 * 4
