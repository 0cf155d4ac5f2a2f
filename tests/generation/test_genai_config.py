"""genai_config: which graphs keep their KV cache in place (past_present_share_buffer)."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from pipeline.generation import genai_config

KV = [1, 2, "past", 16]  # [B, KV heads, cached tokens, head size]


def decoder_graph(path: Path, *, gqa: bool, through_identity: bool = False, swapped: bool = False) -> Path:
    """A one-layer decoder's cache wiring (never run): past.* in, present.* out of either
    ORT's GroupQueryAttention or ONNX Attention; optionally an Identity before present.0.value,
    or the two presents' names swapped (the key's cache comes back as present.0.value)."""
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "s"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "t"]),
              helper.make_tensor_value_info("past_key_values.0.key", f, KV),
              helper.make_tensor_value_info("past_key_values.0.value", f, KV)]
    value = "v_out" if through_identity else "present.0.value"
    if gqa:
        attention = helper.make_node(
            "GroupQueryAttention", ["q", "k", "v", "past_key_values.0.key", "past_key_values.0.value",
                                    "seqlens_k", "total_len"],
            ["logits", *(([value, "present.0.key"]) if swapped else ["present.0.key", value])],
            domain="com.microsoft", num_heads=4, kv_num_heads=2)
    else:
        attention = helper.make_node(
            "Attention", ["q", "k", "v", "mask", "past_key_values.0.key", "past_key_values.0.value"],
            ["logits", "present.0.key", value])
    nodes = [attention] + ([helper.make_node("Identity", ["v_out"], ["present.0.value"])] if through_identity else [])
    outputs = [helper.make_tensor_value_info(n, f, None) for n in ("logits", "present.0.key", "present.0.value")]
    onnx.save(helper.make_model(helper.make_graph(nodes, "decoder", inputs, outputs)), str(path))
    return path


def test_group_query_attention_on_the_graphs_pasts_and_presents_is_in_place(tmp_path):
    assert genai_config.in_place_cache(decoder_graph(tmp_path / "gqa.onnx", gqa=True))


def test_onnx_attention_or_a_present_made_by_another_node_is_not(tmp_path):
    assert not genai_config.in_place_cache(decoder_graph(tmp_path / "attention.onnx", gqa=False))
    # the kernel's output would be copied into the present: no single buffer to share
    assert not genai_config.in_place_cache(decoder_graph(tmp_path / "copy.onnx", gqa=True, through_identity=True))
    # a runner binds present.0.key to past_key_values.0.key's buffer: it must be that cache
    assert not genai_config.in_place_cache(decoder_graph(tmp_path / "swapped.onnx", gqa=True, swapped=True))


def test_the_config_says_so():
    kw = dict(layers=1, kv_heads=2, heads=4, head_dim=16, hidden=64, vocab=32, eos_token_id=2,
              context_length=64, filename="onnxruntime.onnx")
    assert genai_config.config(**kw, in_place=True)["search"]["past_present_share_buffer"] is True
    assert genai_config.config(**kw)["search"]["past_present_share_buffer"] is False
