"""INT4 from a GGUF checkpoint's own blocks (pipeline/precision/checkpoint.py): Q4_1 and Q8_0
tensors carried into MatMulNBits, every MatMul weight found by content (transposed, packed,
row-permuted), checked by ONNX Runtime against the graph's float weights."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf", reason="the gguf package reads GGUF checkpoints (pip install gguf)")

K = 64


def _checkpoint(path, tensors: dict[str, tuple[np.ndarray, str]]) -> dict[str, np.ndarray]:
    """Write a GGUF of block-quantized tensors; returns each one de-quantized (the baseline's floats)."""
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFWriter, quants

    writer = GGUFWriter(str(path), "llama")
    floats = {}
    for name, (w, kind) in tensors.items():
        raw = quants.quantize(w, getattr(Q, kind))
        writer.add_tensor(name, raw, raw_dtype=getattr(Q, kind))
        floats[name] = quants.dequantize(raw, getattr(Q, kind)).astype(np.float32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return floats


def _graph(weights: dict[str, np.ndarray]):
    """x [1, K] -> one MatMul per weight [K, N] -> outputs y_<name>."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("MatMul", ["x", f"w_{n}"], [f"y_{n}"], name=f"mm_{n}") for n in weights]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K])],
        [helper.make_tensor_value_info(f"y_{n}", TensorProto.FLOAT, None) for n in weights],
        [numpy_helper.from_array(w, f"w_{n}") for n, w in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _run(model, x):
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})))


def test_checkpoint_blocks_become_matmulnbits_with_the_baselines_weights(tmp_path):
    from onnx import TensorProto

    from pipeline.precision.checkpoint import from_checkpoint

    rng = np.random.default_rng(0)
    raw = {"blk.0.attn_q.weight": (rng.standard_normal((48, K)).astype(np.float32), "Q4_1"),
           "blk.0.attn_k.weight": (rng.standard_normal((16, K)).astype(np.float32), "Q4_1"),
           "token_embd.weight": (rng.standard_normal((40, K)).astype(np.float32), "Q8_0")}
    floats = _checkpoint(tmp_path / "m.gguf", raw)
    q, k = floats["blk.0.attn_q.weight"], floats["blk.0.attn_k.weight"]
    weights = {
        "packed": np.concatenate([q[::-1].T, k.T], axis=1),  # q|k packed, q's rows permuted
        "head": floats["token_embd.weight"].T,  # the tied LM head: Q8_0
        "other": rng.standard_normal((K, 8)).astype(np.float32),  # not in the checkpoint
    }
    model = _graph(weights)
    x = rng.standard_normal((1, K)).astype(np.float32)
    want = _run(model, x)
    # accuracy_level 0: float activations, so the outputs show the weights alone (engines use
    # 4, int8 activations per block, as ORT's fusion of the requantize route does)
    meta = from_checkpoint(model, tmp_path / "m.gguf", accuracy_level=0)
    assert meta["quantized_nodes"] == 2 and meta["by_block_type"] == {"q4_1": 1, "q8_0": 1}
    assert meta["left_float"] == ["mm_other"]
    ops = {n.name: n for n in model.graph.node}
    assert ops["mm_packed_Q4"].op_type == "MatMulNBits" and ops["mm_head_Q8"].op_type == "MatMulNBits"
    # ONNX Runtime's own de-quantization, d * q plus the minimum's block-sum term, is the
    # baseline's d * q + m bit for bit
    assert meta["weights_vs_baseline"] == {"max_abs": 0.0, "bit_exact_share": 1.0}
    # integer zero points only: a float zero point sends MatMulNBits down ONNX Runtime's slow
    # path (20-200x per MatMul); Q4_1's minimum is the block-sum MatMul added after it
    zero_points = {i.name: i.data_type for i in model.graph.initializer if i.name.endswith("/zero_points")}
    assert len(zero_points) == 2 and set(zero_points.values()) == {TensorProto.UINT8}
    assert [n.op_type for n in model.graph.node if n.op_type != "MatMulNBits"] == [
        "Reshape", "ReduceSum", "MatMul", "Add", "MatMul"]  # x's block sums, the minimum's term, mm_other
    # the report says which route the engine took (this meta once failed the report: KeyError)
    from pipeline.precision.report import markdown

    text = "\n".join(markdown({"mode": "int4", "block_size": 32, **meta}))
    assert "2 MatMuls from the checkpoint's own blocks (1 Q4_1, 1 Q8_0; block size 32)" in text
    assert "bit-exact share 1.0000" in text and "left float: mm_other" in text
    got = _run(model, x)
    for name in weights:
        assert np.abs(got[f"y_{name}"] - want[f"y_{name}"]).max() < 1e-5 * np.abs(want[f"y_{name}"]).max()
    # a second symmetric quantization (the requantize route) moves the weights by far more
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    again = _graph(weights)
    requantized = MatMulNBitsQuantizer(again, block_size=32, is_symmetric=True)
    requantized.process()
    moved = np.abs(_run(requantized.model.model, x)["y_packed"] - want["y_packed"]).max()
    assert moved > 100 * max(np.abs(got["y_packed"] - want["y_packed"]).max(), 1e-7)


def test_a_graph_that_is_not_the_checkpoints_is_left_float(tmp_path):
    from pipeline.precision.checkpoint import from_checkpoint

    rng = np.random.default_rng(1)
    _checkpoint(tmp_path / "m.gguf", {"blk.0.ffn_up.weight": (rng.standard_normal((32, K)).astype(np.float32), "Q4_1")})
    model = _graph({"w": rng.standard_normal((K, 32)).astype(np.float32)})
    meta = from_checkpoint(model, tmp_path / "m.gguf")
    assert meta["quantized_nodes"] == 0 and meta["left_float"] == ["mm_w"]
    assert [n.op_type for n in model.graph.node] == ["MatMul"]


def test_recipe_asks_for_int4_block_32():
    from pydantic import ValidationError

    from pipeline.recipe.precision import PrecisionSpec

    assert PrecisionSpec(mode="int4", int4_source="checkpoint").int4_source == "checkpoint"
    for bad in ({"mode": "int8", "int4_source": "checkpoint"},
                {"mode": "int4", "block_size": 64, "int4_source": "checkpoint"}):
        with pytest.raises(ValidationError, match="block_size 32"):
            PrecisionSpec(**bad)


def test_a_transposed_tied_head_becomes_a_quantizable_matmul():
    """FusedMatMul(x, E, transB=1) (ort_fusions' form of a tied LM head) -> MatMul(x, E^T)."""
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.precision.int4 import untranspose_weights

    rng = np.random.default_rng(2)
    emb = rng.standard_normal((40, K)).astype(np.float32)
    node = helper.make_node("FusedMatMul", ["x", "emb"], ["y"], domain="com.microsoft", transB=1, alpha=1.0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(emb, "emb")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    x = rng.standard_normal((1, K)).astype(np.float32)
    want = _run(model, x)["y"]
    assert untranspose_weights(model) == 1
    assert [(n.op_type, n.domain) for n in model.graph.node] == [("MatMul", "")]
    assert np.allclose(_run(model, x)["y"], want, atol=1e-5)


def test_q4_1_edge_blocks_multiply_with_the_ggufs_own_floats():
    """Q4_1 blocks as a GGUF stores them, edge cases included (d == 0, m == 0, m > 0, fp16
    subnormal and largest minimums, q all 0 or all 15), carried into the form the
    build uses and read back through ONNX Runtime: the weights it multiplies with equal gguf's
    de-quantization bit for bit. Exact equality is the right tolerance: d*q (an fp16 times a
    4-bit integer) and m are exact in float32, and both sides add them with one rounding."""
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    from pipeline.precision.checkpoint import _blocks, _dequantized, _matmul_nbits

    rng = np.random.default_rng(3)
    rows, nb = 24, 3
    d = rng.uniform(1e-4, 0.05, (rows, nb)).astype(np.float16)
    m = (-d.astype(np.float32) * rng.uniform(0, 15, (rows, nb))).astype(np.float16)
    d[0, 0], m[1, 0], m[2, 1], m[3, 2], m[4, 0], d[5, 1] = 0, 0, 0.125, np.float16(6e-8), 65504, 65504
    q = rng.integers(0, 16, (rows, nb, 32)).astype(np.uint8)
    q[6, 0], q[7, 1] = 0, 15
    raw = np.concatenate([d[..., None].view(np.uint8), m[..., None].view(np.uint8),
                          q[..., :16] | (q[..., 16:] << 4)], axis=-1).reshape(rows, nb * 20)
    want = quants.dequantize(raw, Q.Q4_1).astype(np.float32).T  # [K, N], what transformers loads

    class Stored:  # a GGUF tensor as GGUFReader gives it
        data, tensor_type = raw, Q.Q4_1

    kind, qs, scale, minimum = _blocks(Stored)
    from onnx import helper

    nodes, inits = _matmul_nbits(helper.make_node("MatMul", ["x", "w"], ["y"]), kind, qs, scale, minimum,
                                 nb * 32, rows, 4, "x/block_sums")
    got = _dequantized(nodes, inits, nb * 32)
    assert np.isfinite(want).all() and (want[:32, 0] == want[0, 0]).all()  # finite; d == 0: 32 times m
    np.testing.assert_array_equal(got, want)


def test_a_q8_0_embedding_is_gathered_from_the_heads_own_bytes(tmp_path):
    """A tied Q8_0 table read twice (Gather for the embedding, MatMul for the LM head) is stored
    once, in 8 bits: GatherBlockQuantized reads the head's MatMulNBits initializer, and every
    row it gathers is the baseline's float row bit for bit (SmolLM2's int4 engine file: the
    float32 table was 113 of its 230 MB)."""
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.precision.checkpoint import from_checkpoint

    rng = np.random.default_rng(4)
    vocab = 40
    table = _checkpoint(tmp_path / "m.gguf", {"token_embd.weight": (rng.standard_normal((vocab, K)).astype(np.float32), "Q8_0")})
    emb = table["token_embd.weight"]  # [V, K]
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["rows"], name="embed"),
             helper.make_node("MatMul", ["x", "head"], ["logits"], name="lm_head")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, None]),
                     helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(emb, "emb"), numpy_helper.from_array(np.ascontiguousarray(emb.T), "head")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    meta = from_checkpoint(model, tmp_path / "m.gguf", accuracy_level=0)
    assert meta["embeddings"] == [{"node": "embed", "blocks": "q8_0", "rows": vocab, "shares_head": True,
                                   "max_abs": 0.0, "bit_exact_share": 1.0}]
    assert [n.op_type for n in model.graph.node] == ["GatherBlockQuantized", "Reshape", "MatMulNBits"]
    tables = [i for i in model.graph.initializer if list(i.dims) in ([vocab, K], [vocab, K // 32, 32])]
    assert len(tables) == 1 and tables[0].data_type == TensorProto.UINT8  # the table, once, in 8 bits
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([[3, 0, vocab - 1, 3]], np.int64)
    x = rng.standard_normal((1, K)).astype(np.float32)
    rows, logits = sess.run(["rows", "logits"], {"ids": ids, "x": x})
    np.testing.assert_array_equal(rows, emb[ids])  # [1, 4, K]
    assert np.abs(logits - x @ emb.T).max() < 1e-5 * np.abs(x @ emb.T).max()
    from pipeline.precision.report import markdown

    text = "\n".join(markdown({"mode": "int4", "block_size": 32, **meta}))
    assert "embedding embed: 40 Q8_0 rows gathered in 8 bits from the LM head's own initializer" in text
