"""precision.int4_method: gptq (pipeline/precision/gptq.py). The algorithm on one synthetic
layer: blocks on their own grids, a lower output error than round-to-nearest on the inputs it
saw. End to end on a decoder with a KV cache (the tiny GQA Llama of the serving tests, random
weights) calibrated on a text file: the text's rows become prefill feeds (the past empty),
every MatMul becomes MatMulNBits with uint8 zero points on MLAS' integer path, and on the text
it was calibrated on the logits move less from the float graph's than under round-to-nearest."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.conftest import FAST_OPT, shared_build
from tests.serving.test_continuous_batching import RECIPE

pytestmark = pytest.mark.slow

ROWS = ["The train to the coast leaves every hour.",
        "She planted tomatoes along the south wall.",
        "Please back up your files before the update."]
GPTQ = """\
extends: tiny-llama-gqa.yaml
data:
  calibration: {text: calibration.jsonl, tokenizer: bytes}
precision: {mode: int4, block_size: 32, int4_method: gptq}
"""


def test_gptq_blocks_sit_on_their_grids_and_err_less_than_round_to_nearest():
    from pipeline.precision import gptq

    rng = np.random.default_rng(0)
    k, n, block = 256, 48, 32
    weight = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    x = rng.standard_normal((600, k)) * np.exp(rng.standard_normal(k) * 0.5)  # uneven channels
    x[:, 1:] += 0.5 * x[:, :-1]  # correlated neighbours: what GPTQ's corrections use
    x[:, 7] = 0  # a channel no token uses
    hessian = 2 * x.T @ x / len(x)
    codes, scales, zeros = gptq.quantize(weight, hessian, block)
    assert codes.shape == (n, k // block, block) and codes.max() <= 15 and zeros.max() <= 15
    ours = ((codes - zeros[..., None].astype(np.float64)) * scales[..., None]).reshape(n, k).T
    assert (ours[7] == 0).all()  # the unused channel: zero, exactly on every grid
    # round-to-nearest on the same kind of grid: each block's min/max (0 included), codes 0..15
    w = weight.T.reshape(n, k // block, block).astype(np.float64)
    low, high = np.minimum(w.min(-1, keepdims=True), 0), np.maximum(w.max(-1, keepdims=True), 0)
    step = (high - low) / 15
    zero = np.round(-low / step)
    rtn = ((np.clip(np.round(w / step) + zero, 0, 15) - zero) * step).reshape(n, k).T
    np.testing.assert_allclose(gptq.weight_of(*gptq.round_to_nearest(weight, block), weight.shape), rtn,
                               rtol=1e-6, atol=1e-7)  # the benchmarks' baseline is this one

    def output_error(approx):
        return np.linalg.norm(x @ approx - x @ weight) / np.linalg.norm(x @ weight)

    assert output_error(ours) < 0.85 * output_error(rtn)

    # the other orders and grids (precision.gptq): each still well under round-to-nearest
    variants = {(a, s): gptq.quantize(weight, hessian, block, act_order=a, search=s)
                for a in (False, True) for s in (False, True)}
    for blocks in variants.values():
        assert blocks[0].max() <= 15 and (blocks[1] > 0).all()
        assert output_error(gptq.weight_of(*blocks, weight.shape)) < 0.85 * output_error(rtn)
    # a searched grid never rounds a block worse than min/max (its range is one of those tried),
    # and on Gaussian weights, whose extremes min/max spans, it rounds them better
    importance = np.diag(hessian)[:block]
    rows = w[:, 0, :]  # each output channel's first block [N, block]

    def rounding_error(search):
        scale, zero = gptq._grid(rows, importance, search)
        q = np.clip(np.round(rows / scale[:, None]) + zero[:, None], 0, 15)
        return (((q - zero[:, None]) * scale[:, None] - rows) ** 2 * importance).sum(1)

    searched, minmax = rounding_error(True), rounding_error(False)
    assert (searched <= minmax).all() and searched.sum() < 0.9 * minmax.sum()


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    return shared_build(tmp_path_factory, "tiny-llama-gqa", "tiny-llama-gqa", *FAST_OPT,
                        recipes={"recipes/tiny-llama-gqa.yaml": RECIPE})


def _recipes(project, method: str):
    """The project's tiny-gptq recipe (and one with `method` instead), loaded in its folder."""
    from pipeline import recipe as recipe_mod

    project.write("recipes/tiny-gptq.yaml", GPTQ)
    project.write("calibration.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in ROWS))
    cwd = os.getcwd()
    os.chdir(project.path)
    try:
        return recipe_mod.load("tiny-gptq"), recipe_mod.load("tiny-gptq", (f"precision.int4_method={method}",))
    finally:
        os.chdir(cwd)


def quantized_against_rtn(project, method: str, tmp_path):
    """The project's tiny-gptq recipe with `method` and with symmetric RTN, each through the int4
    precision stage in the project's folder (the calibration text's path is the project's):
    (its calibration feeds, (typed graph, meta) with `method`, typed graph with RTN)."""
    from pipeline import data
    from pipeline.precision import int4

    (tmp_path / method).mkdir()
    (tmp_path / "rtn").mkdir()
    _, ours = _recipes(project, method)
    _, rtn = _recipes(project, "rtn")
    cwd = os.getcwd()
    os.chdir(project.path)
    try:
        return (data.calibration_feeds(ours), int4.apply(ours, project.built / "optimized.onnx", tmp_path / method),
                int4.apply(rtn, project.built / "optimized.onnx", tmp_path / "rtn")[0])
    finally:
        os.chdir(cwd)


def test_gptq_calibrates_a_kv_cache_decoder_on_text_prefills_and_beats_rtn(gqa, tmp_path):
    import onnx
    from onnx import TensorProto

    from pipeline.metrics import graph_check as check
    from pipeline.precision import effective

    feeds, (out, meta), rtn_out = quantized_against_rtn(gqa, "gptq", tmp_path)

    # each text row is one prefill: its bytes as ids, the mask over them, an empty past per layer
    assert [f["input_ids"].tolist() for f in feeds] == [[list(t.encode())] for t in ROWS]
    for feed in feeds:
        assert (feed["attention_mask"] == 1).all() and feed["attention_mask"].shape == feed["input_ids"].shape
        pasts = [k for k in feed if k.startswith("past_key_values.")]
        assert len(pasts) == 4 and all(feed[k].shape == (1, 2, 0, 16) for k in pasts)

    assert meta["method"] == "gptq" and meta["symmetric"] is False
    assert meta["calibration_feeds"] == 3 and meta["calibration_tokens"] == sum(len(t) for t in ROWS)
    assert meta["gptq_nodes"] == meta["quantized_nodes"]
    errors = meta["relative_output_error"]  # each layer on the calibration inputs, GPTQ vs RTN
    assert 0 < errors["gptq"] < errors["rtn"]
    model = onnx.load(str(out))
    inits = {i.name: i for i in model.graph.initializer}
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == meta["quantized_nodes"] == meta["quantizable_nodes"] > 0
    assert all(inits[n.input[3]].data_type == TensorProto.UINT8 for n in nbits)  # integer zero points
    summary = effective.accuracy_levels(out)
    assert summary.accuracy_levels == {"4": len(nbits)} and summary.activations == ["int8"]

    # what GPTQ minimizes, measured end to end: the logits on its calibration text
    def logits(path):
        return np.concatenate([r["logits"].ravel() for r in check.run(str(path), feeds, ["logits"], optimize=False)])

    ref, ours, theirs = (logits(p) for p in (gqa.built / "optimized.onnx", out, rtn_out))
    assert np.abs(ours - ref).mean() < np.abs(theirs - ref).mean()


def test_sequential_gptq_takes_each_layers_inputs_after_the_layers_before_it_are_rounded(gqa):
    import onnx

    from pipeline.precision import gptq, int4
    from pipeline.recipe.precision import GptqSpec

    recipe, _ = _recipes(gqa, "rtn")
    cwd = os.getcwd()
    os.chdir(gqa.path)
    try:
        from pipeline import data

        feeds = data.calibration_feeds(recipe)
    finally:
        os.chdir(cwd)
    model = onnx.load(str(gqa.built / "optimized.onnx"))
    int4.untranspose_weights(model)
    inits = {i.name: i for i in model.graph.initializer}
    weights = {n.name: n.input[1] for n in model.graph.node
               if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims) == 2}
    originals = {w: onnx.numpy_helper.to_array(inits[w]) for w in weights.values()}
    order = [n.input[1] for n in model.graph.node if n.name in weights]
    source = {n.input[1]: n.input[0] for n in model.graph.node if n.name in weights}
    first = [w for w in order if source[w] == source[order[0]]]  # the graph input's layers

    plain, tokens, none = gptq.hessians(model, weights, feeds)
    seq, seq_tokens, solved = gptq.hessians(model, weights, feeds, GptqSpec(sequential=1), originals, 32)
    assert none == {} and tokens == seq_tokens and set(solved) == set(plain) == set(seq)
    # the first layer's inputs (and its siblings') come before any rounding; every later layer
    # sees rounded ones
    assert all(np.allclose(seq[w], plain[w], rtol=1e-6) for w in first)
    assert len(order) > len(first) and all(not np.allclose(seq[w], plain[w], rtol=1e-6)
                                           for w in order if w not in first)
    # and its blocks are GPTQ's for that Hessian
    codes, scales, zeros = gptq.quantize(originals[order[-1]], seq[order[-1]], 32)
    assert (solved[order[-1]][0] == codes).all()


def test_int8_layers_write_the_named_layers_as_8_bit_blocks_and_the_rest_as_gptq(gqa, tmp_path):
    import onnx
    from onnx import helper

    from pipeline.precision import int4, nodes

    graph = onnx.load(str(gqa.built / "optimized.onnx"))
    int4.untranspose_weights(graph)
    names = nodes.quantizable(graph, ["MatMul"], weight_only=True)
    chosen = names[1]  # one layer by exact name
    _recipes(gqa, "rtn")  # writes the project's tiny-gptq recipe and its text
    cwd = os.getcwd()
    os.chdir(gqa.path)
    try:
        from pipeline import recipe as recipe_mod

        recipe = recipe_mod.load("tiny-gptq", (f'precision.int8_layers=["{chosen}"]',))
        out, meta = int4.apply(recipe, gqa.built / "optimized.onnx", tmp_path)
    finally:
        os.chdir(cwd)
    assert meta["int8_nodes"] == [chosen] and meta["excluded"] == []
    assert meta["gptq_nodes"] == meta["quantized_nodes"] == len(names) - 1
    bits = {n.name: helper.get_attribute_value(next(a for a in n.attribute if a.name == "bits"))
            for n in onnx.load(str(out), load_external_data=False).graph.node if n.op_type == "MatMulNBits"}
    assert bits.pop(f"{chosen}_Q8") == 8 and set(bits.values()) == {4} and len(bits) == len(names) - 1


def test_int8_layers_refuse_a_pattern_that_matches_no_layer_and_other_modes():
    from pipeline.core.errors import RecipeError
    from pipeline.precision import nodes
    from pipeline.recipe.precision import PrecisionSpec

    with pytest.raises(RecipeError, match="precision.int8_layers: `down_proj` matches no quantizable node"):
        nodes.excluded(["node_linear_6"], ["down_proj"], "precision.int8_layers")
    with pytest.raises(ValueError, match="int8_layers applies to mode int4"):
        PrecisionSpec(mode="int8", scheme="dynamic", int8_layers=["x"])
    with pytest.raises(ValueError, match="int8_layers: `\\(` is not a valid regex"):
        PrecisionSpec(mode="int4", int8_layers=["("])
