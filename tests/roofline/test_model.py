"""A node's floor on a hardware entry: the larger of compute and memory time, its bound, the
peak its type maps to (fallbacks said), and the ops a device's runtime would not run."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.roofline.test_costs import _model, _vi


def _entry(kind="cpu", peaks=None, bandwidth=1e10):
    from pipeline.hardware.entry import Bandwidth, HardwareEntry, Peak, Source

    peaks = peaks or {"fp32": 1e11}
    return HardwareEntry(name="dev", title="dev", kind=kind, provenance="specified",
                         source=Source(document="test", date="2026"), bandwidth=[Bandwidth(level="DRAM", bytes_per_s=bandwidth)],
                         peaks=[Peak(dtype=d, ops_per_s=v, isa="x") for d, v in peaks.items()], runtimes=[])


def _two_nodes():
    """A [64 x 256] x [256 x 256] MatMul (8.4 MFLOP, 0.3 MB) and a Relu on its output."""
    w = numpy_helper.from_array(np.ones((256, 256), np.float32), "w")
    from pipeline.roofline import costs, shapes

    model = _model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                   [_vi("x", ["rows", 256])], [_vi("y", ["rows", 256])], [w])
    return costs.graph_cost(shapes.skeleton(model), {"rows": 64})


def test_each_node_takes_the_larger_of_compute_and_memory_time():
    from pipeline.roofline import model

    cost = _two_nodes()
    matmul, relu = model.roofline(cost, _entry(peaks={"fp32": 1e9}, bandwidth=1e12)).nodes
    flops, moved = 2 * 64 * 256 * 256, (64 * 256 + 256 * 256 + 64 * 256) * 4
    assert matmul.compute_s == pytest.approx(flops / 1e9) and matmul.memory_s == pytest.approx(moved / 1e12)
    assert matmul.bound == "compute" and matmul.time_s == matmul.compute_s
    assert relu.bound == "memory" and relu.compute_s == 0 and relu.time_s == pytest.approx(2 * 64 * 256 * 4 / 1e12)
    slow_memory = model.roofline(cost, _entry(peaks={"fp32": 1e15}, bandwidth=1e9))
    assert slow_memory.nodes[0].bound == "memory" and slow_memory.compute_bound_share == 0
    cats = slow_memory.by_category()
    assert cats["matmul/conv"].flops == flops and cats["elementwise"].nodes == 1
    assert slow_memory.time_s == pytest.approx(sum(c.time_s for c in cats.values()))


def test_a_type_without_a_peak_falls_back_to_fp32_and_says_so():
    from pipeline.roofline import costs, model, shapes

    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    b = numpy_helper.from_array(np.ones((32, 16), np.int8), "b")
    cost = costs.graph_cost(shapes.skeleton(_model([node], [_vi("a", [8, 32], TensorProto.UINT8)],
                                                   [_vi("y", [8, 16], TensorProto.INT32)], [b])), {})
    assert cost.nodes[0].dtype == "int8"
    r = model.roofline(cost, _entry(peaks={"fp32": 1e9}))
    assert r.nodes[0].dtype == "fp32" and r.fallbacks == ("int8 -> fp32: dev has no int8 peak",)
    assert model.roofline(cost, _entry(peaks={"fp32": 1e9, "int8": 4e9})).nodes[0].compute_s == pytest.approx(
        2 * 8 * 32 * 16 / 4e9)


def test_on_a_gpu_float32_products_may_use_tf32():
    from pipeline.roofline import model

    r = model.roofline(_two_nodes(), _entry("gpu", peaks={"fp32": 1e12, "tf32": 8e12}))
    assert r.nodes[0].dtype == "tf32" and r.nodes[1].dtype == "-"


def test_ops_a_runtime_lacks_are_named_with_how_we_know():
    from pipeline.roofline import shapes, support

    nodes = [helper.make_node("MatMulIntegerToFloat", ["a", "b", "sa", "sb"], ["m"], domain="com.microsoft"),
             helper.make_node("SimplifiedLayerNormalization", ["m", "g"], ["n"]),
             helper.make_node("NoSuchOp", ["n"], ["y"], domain="com.microsoft")]
    inits = [numpy_helper.from_array(np.ones((4, 4), np.int8), "b"), numpy_helper.from_array(np.ones(1, np.float32), "sa"),
             numpy_helper.from_array(np.ones(1, np.float32), "sb"), numpy_helper.from_array(np.ones(4, np.float32), "g")]
    skel = shapes.skeleton(_model(nodes, [_vi("a", [2, 4], TensorProto.UINT8)], [_vi("y", [2, 4])], inits))
    cpu = support.cpu_support(skel)
    assert [u.op for u in cpu.unsupported] == ["com.microsoft.NoSuchOp"] and "kernel registry" in cpu.how
    cuda = {u.op: u.why for u in support.cuda_support(skel).unsupported}
    assert "no CUDA kernel" in cuda["com.microsoft.MatMulIntegerToFloat"] and "OperatorKernels.md" in support.ORT_KERNELS_DOC
    trt = {u.op for u in support.tensorrt_support(skel).unsupported}
    assert trt == {"com.microsoft.MatMulIntegerToFloat", "ai.onnx.SimplifiedLayerNormalization", "com.microsoft.NoSuchOp"}
    assert "does not run on a CPU" in support.engine_kind_note("tensorrt", _entry("cpu"))


def test_a_float32_group_query_attention_has_no_cuda_kernel():
    """ORT's CUDA GroupQueryAttention takes fp16/bf16 only: SmolLM2's fp32 engine would run it
    on the CPU EP."""
    from pipeline.roofline import shapes, support
    from tests.roofline.test_costs import F32

    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens", "total"],
                            ["out", "present_k", "present_v"], domain="com.microsoft", num_heads=2, kv_num_heads=1)
    inputs = [_vi("q", [1, 3, 16]), _vi("k", [1, 3, 8]), _vi("v", [1, 3, 8]), _vi("pk", [1, 1, 5, 8]),
              _vi("pv", [1, 1, 5, 8]), _vi("seqlens", [1], TensorProto.INT32), _vi("total", [], TensorProto.INT32)]
    skel = shapes.skeleton(_model([node], inputs, [_vi("out", [1, 3, 16], F32)]))
    (gqa,) = support.cuda_support(skel).unsupported
    assert gqa.op == "com.microsoft.GroupQueryAttention" and "bfloat16/float16 only" in gqa.why
    assert support.cpu_support(skel).unsupported == []
