"""precision.int4_method: autoround (pipeline/precision/autoround.py). The rounding before any
step is min/max round-to-nearest; fitting lowers every decoder layer's output error on a tiny
random Llama; the fitted blocks find their graph weights by value, packed q|k|v included. End
to end on the tiny GQA Llama with a KV cache (the serving tests' model, calibrated on a text
file): every decoder MatMul becomes MatMulNBits with AutoRound's blocks, the LM head keeps
round-to-nearest, and the logits on the calibration text move less than under RTN."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.recipe.precision import AutoRoundSpec
from tests.precision.test_gptq import ROWS, gqa, quantized_against_rtn  # noqa: F401 (the module's build)


def _tiny_llama():
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_the_rounding_starts_as_round_to_nearest():
    import torch

    from pipeline.precision import autoround, gptq

    weight = torch.randn(24, 64) * 0.05  # [out, K]
    start = autoround.Rounding(weight, 32).numpy_blocks()
    for ours, theirs in zip(start, gptq.round_to_nearest(weight.T.numpy().astype(np.float64), 32)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_fitting_lowers_every_layers_output_error_and_blocks_find_their_graph_weights():
    import torch

    from pipeline.precision import autoround

    model = _tiny_llama()
    sequences = [torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(n)) for n in (12, 9, 15, 7)]
    fitted, fits = autoround.fit(model, sequences, 32, AutoRoundSpec(iters=40, sequences=2))
    assert [f.layer for f in fits] == [0, 1]
    assert all(0 < f.fitted < 0.8 * f.rtn for f in fits), fits
    layer = model.model.layers[1]
    assert set(fitted) == {f"{i}.{name}" for i in (0, 1) for name, m in layer.named_modules()
                           if isinstance(m, torch.nn.Linear)}
    codes = fitted["1.mlp.down_proj"].codes
    assert codes.shape == (64, 96 // 32, 32) and codes.max() <= 15 and codes.dtype == np.uint8

    # the graph's weights are [K, N]: q|k|v packed side by side, one layer alone, and one no
    # decoder layer makes (the LM head)
    def t(name):
        return fitted[name].weight.T.copy()

    originals = {"qkv": np.concatenate([t("0.self_attn.q_proj"), t("0.self_attn.k_proj"), t("0.self_attn.v_proj")], 1),
                 "down": t("1.mlp.down_proj"),
                 "head": model.lm_head.weight.detach().numpy().T.copy()}
    blocks, missing = autoround.onnx_blocks(originals, fitted)
    assert missing == ["head"] and set(blocks) == {"qkv", "down"}
    parts = [fitted[f"0.self_attn.{p}_proj"] for p in "qkv"]
    for index, field in enumerate(("codes", "scales", "zeros")):
        np.testing.assert_array_equal(blocks["qkv"][index], np.concatenate([getattr(p, field) for p in parts]))
    assert blocks["down"][0] is not None and (blocks["down"][0] == fitted["1.mlp.down_proj"].codes).all()


def test_long_sequences_are_cut_into_pieces():
    import torch

    from pipeline.precision import autoround

    cut = autoround.pieces([torch.arange(300)[None], torch.arange(50)[None]], 128)
    assert [p.shape[-1] for p in cut] == [128, 128, 44, 50]
    assert torch.equal(torch.cat(cut[:3], -1), torch.arange(300)[None])


def test_autoround_is_refused_where_it_cannot_run():
    from pipeline import recipe as recipe_mod
    from pipeline.core.errors import RecipeError
    from pipeline.recipe.precision import PrecisionSpec

    assert recipe_mod.load("smollm2-float-int4-autoround").precision.int4_method == "autoround"
    with pytest.raises(RecipeError, match="precision.int4_method: autoround fits the decoder layers of a "
                                          "transformers causal LM"):  # standard is a zoo model
        recipe_mod.load("standard", ["precision.mode=int4", "precision.int4_method=autoround"])

    with pytest.raises(ValueError, match="precision.autoround applies to int4_method autoround"):
        PrecisionSpec(mode="int4", autoround={"iters": 10})
    with pytest.raises(ValueError, match="int4_method applies to mode int4"):
        PrecisionSpec(mode="int8", int4_method="autoround")


@pytest.mark.slow
def test_autoround_fits_a_kv_cache_decoder_and_beats_rtn_on_its_logits(gqa, tmp_path):  # noqa: F811
    import onnx
    from onnx import TensorProto

    from pipeline.metrics import graph_check as check

    feeds, (out, meta), rtn_out = quantized_against_rtn(gqa, "autoround", tmp_path)

    assert meta["method"] == "autoround" and meta["symmetric"] is False
    assert meta["calibration_feeds"] == 3 and meta["calibration_tokens"] == sum(len(t) for t in ROWS)
    # two decoder layers of q|k|v, o, gate|up and down; the LM head (no decoder layer's) keeps RTN
    assert meta["autoround_nodes"] == 8 == meta["quantized_nodes"] - 1
    assert len(meta["rounded_to_nearest"]) == 1
    assert [e["layer"] for e in meta["layer_output_error"]] == [0, 1]
    assert all(e["autoround"] < e["rtn"] for e in meta["layer_output_error"])
    model = onnx.load(str(out))
    inits = {i.name: i for i in model.graph.initializer}
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == meta["quantized_nodes"] and all(inits[n.input[3]].data_type == TensorProto.UINT8 for n in nbits)

    def logits(path):
        return np.concatenate([r["logits"].ravel() for r in check.run(str(path), feeds, ["logits"], optimize=False)])

    ref, ours, theirs = (logits(p) for p in (gqa.built / "optimized.onnx", out, rtn_out))
    assert np.abs(ours - ref).mean() < np.abs(theirs - ref).mean()
