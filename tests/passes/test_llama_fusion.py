"""A transformers Llama (grouped-query attention, random weights) through the optimize stage:
repeat_kv dropped and the cache folded into Attention, then ORT's GroupQueryAttention (rotary
inside, packed q|k|v) and SkipSimplifiedLayerNormalization, each pass checked against its
input graph; a pass that finds nothing says "no match"."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import Project

LAYERS = 2
RECIPE = f"""description: tiny Llama, GQA 4/2, random weights
model:
  transformers:
    config: {{model_type: llama, vocab_size: 256, hidden_size: 64, intermediate_size: 128,
             num_hidden_layers: {LAYERS}, num_attention_heads: 4, num_key_value_heads: 2,
             max_position_embeddings: 512, bos_token_id: 1, eos_token_id: 2}}
    seed: 0
    task: logits
inputs:
  - name: input_ids
    dtype: int64
    shape:
      - {{name: batch, min: 1, opt: 1, max: 2}}
      - {{name: sequence, min: 1, opt: 8, max: 16}}
    range: [0, 256]
outputs: [logits]
export: {{parity: {{max_abs: 1.0e-3, cosine_min: 0.9999}}}}
optimize:
  # the second attention_with_past finds nothing left to fold: "no match", not "accepted"
  passes: [fold_constants, attention_with_past, attention_with_past, ort_fusions, pack_matmuls,
           group_query_attention]
  options: {{group_query_attention: {{max_positions: 512}}}}
data: {{calibration: null}}
targets: [{{kind: onnxruntime}}]
workload:
  kind: generation
  prompt_lengths: [8]
  new_tokens: 4
  batch_sizes: [1]
  task: [{{prompt: 6, new_tokens: 3}}]
"""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def optimized(tmp_path_factory) -> tuple[dict, Project]:
    proj = Project(tmp_path_factory.mktemp("llama"))
    proj.write("recipes/tiny-llama.yaml", RECIPE)
    res = proj.run("optimize", "tiny-llama")
    assert res.code == 0, res.err
    manifest = json.loads((proj.engines / "tiny-llama" / "manifest.json").read_text())
    return manifest["stages"]["optimize"]["meta"], proj


def test_repeated_kv_heads_are_dropped_and_the_cache_folds(optimized):
    meta, _ = optimized
    fold, again = meta["passes"][1], meta["passes"][2]
    assert fold["status"] == "accepted"
    assert fold["info"]["attention_with_past"] == LAYERS and fold["info"]["kv_heads_ungrouped"] == 2 * LAYERS
    # the Unsqueeze/Expand/Reshape repetition of K and V and the cache's Concat are gone
    assert fold["ops_before"]["Expand"] - fold["ops_after"].get("Expand", 0) == 2 * LAYERS
    assert fold["ops_before"]["Concat"] - fold["ops_after"].get("Concat", 0) >= 2 * LAYERS
    assert max(m["max_abs"] for m in fold["check"].values()) < 1e-4
    assert again["status"] == "no match" and again["nodes_before"] == again["nodes_after"]
    assert meta["no_match"] == ["attention_with_past"] and "attention_with_past" in meta["accepted"]


def test_attention_rotary_and_norms_fuse_like_the_genai_builder(optimized):
    meta, _ = optimized
    gqa = meta["passes"][-1]
    assert gqa["status"] == "accepted", gqa["reason"]
    assert gqa["info"]["group_query_attention"] == LAYERS and gqa["info"]["packed_qkv"] == LAYERS
    ops = meta["ops_after"]
    assert ops["GroupQueryAttention"] == LAYERS and ops["SkipSimplifiedLayerNormalization"] == 2 * LAYERS
    for gone in ("Attention", "RotaryEmbedding", "Transpose", "Expand", "RMSNormalization"):
        assert gone not in ops, gone
    # per layer: 2 skip norms, q|k|v, o, gate|up and down MatMuls, GQA, Split, SiLU (2), Mul
    assert meta["nodes_after"] <= 11 * LAYERS + 10 < meta["nodes_before"]
    # checked on prefill and decode at batch 2 (the form a runner feeds), within 1e-4
    assert {"max:prefill", "max:decode"} <= set(meta["check_feeds"])
    assert max(m["max_abs"] for m in gqa["check"].values()) < 1e-4


def test_fused_graph_generates_what_the_exported_one_does(optimized):
    """Prefill then three decode steps, each fed its own presents: same logits as the export."""
    import onnxruntime as ort

    _, proj = optimized
    folder = proj.engines / "tiny-llama"
    sessions = [ort.InferenceSession(str(folder / name), providers=["CPUExecutionProvider"])
                for name in ("model.onnx", "optimized.onnx")]
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 256, (1, 9))
    logits = []
    for sess in sessions:
        names = [i.name for i in sess.get_inputs()][2:]
        past = {n: np.zeros((1, 2, 0, 16), np.float32) for n in names}
        out_all, lo = [], 0
        for hi in (6, 7, 8, 9):
            out = sess.run(None, {"input_ids": ids[:, lo:hi], "attention_mask": np.ones((1, hi), np.int64), **past})
            out_all.append(out[0][:, -1])
            past, lo = dict(zip(names, out[1:])), hi
        logits.append(np.concatenate(out_all))
    assert np.abs(logits[0] - logits[1]).max() < 1e-4


def test_fused_graph_keeps_its_cache_in_place(optimized, monkeypatch, tmp_path):
    """GroupQueryAttention appends into a preallocated buffer: the IOBinding loop binds each
    present to its past's buffer (growing it past its first capacity, twice here) and greedy
    tokens over two turns equal the exported graph's, whose cache grows by concatenation;
    onnxruntime-genai with past_present_share_buffer true generates the same first turn."""
    import onnxruntime_genai  # noqa: F401  (a real dependency: no skip)

    from pipeline.generation import genai_config, runners
    from pipeline.generation.timed_requests import Request, generate

    _, proj = optimized
    folder = proj.engines / "tiny-llama"
    monkeypatch.setattr(runners, "FIRST_CAPACITY", 4)
    fused, exported = (runners.OrtLoopRunner(folder / n, eos=2, threads=1) for n in ("optimized.onnx", "model.onnx"))
    assert fused.in_place and not exported.in_place
    rng = np.random.default_rng(1)
    turns = Request("t", "task", 1, ((rng.integers(3, 256, size=(1, 7)), 5),
                                     (rng.integers(3, 256, size=(1, 4)), 5)))
    tokens = generate(fused, turns).tokens
    # turn 1: 7 prompt + 4 fed replies; turn 2: the reply's last token + 4 prompt + 4 replies;
    # 4 -> 7 + 4 of room -> 22 (twice 11; 16 needed)
    assert fused.length == 7 + 4 + 5 + 4 and fused.capacity == 22
    assert (tokens == generate(exported, turns).tokens).all()

    cfg = genai_config.config(layers=LAYERS, kv_heads=2, heads=4, head_dim=16, hidden=64, vocab=256,
                              eos_token_id=2, context_length=32, filename="optimized.onnx",
                              in_place=genai_config.in_place_cache(folder / "optimized.onnx"))
    assert cfg["search"]["past_present_share_buffer"] is True
    genai = runners.GenaiRunner(genai_config.write_folder(tmp_path / "g", folder / "optimized.onnx", cfg), 32)
    first = Request("p", "point", 1, turns.turns[:1])
    assert (generate(genai, first).tokens == generate(exported, first).tokens).all()


def test_profile_runs_an_in_place_graph_as_its_runners_do(optimized):
    """explain.profile binds the fused graph's presents to its pasts' buffers (the exported
    graph, which concatenates, runs as saved) and both profile the same decode feed."""
    from pipeline.explain import profile

    _, proj = optimized
    folder = proj.engines / "tiny-llama"
    rng = np.random.default_rng(2)
    past = 11
    feed = {"input_ids": rng.integers(3, 256, (1, 1)), "attention_mask": np.ones((1, past + 1), np.int64),
            **{f"past_key_values.{i}.{kv}": rng.standard_normal((1, 2, past, 16)).astype(np.float32)
               for i in range(LAYERS) for kv in ("key", "value")}}
    before = {k: v.copy() for k, v in feed.items()}
    runs = profile.profile_sessions({"fused": folder / "optimized.onnx", "exported": folder / "model.onnx"},
                                    feed, runs=3, warmup=1, threads=1)
    assert runs["fused"].cache_in_place and not runs["exported"].cache_in_place
    ops = {n.op for n in runs["fused"].nodes}
    assert "GroupQueryAttention" in ops and "Concat" not in ops
    assert all((feed[k] == before[k]).all() for k in feed)  # the caller's arrays are not written


def test_a_sliding_window_is_kept_where_it_changes_nothing_and_judged_where_it_does(optimized):
    """`options.group_query_attention.local_window` (sparse attention, GQA's local_window_size):
    a window as long as the recipe's longest sequence (16) changes no logit, so the pass is
    accepted and every GroupQueryAttention carries it; a window of 4 changes the logits of a
    16-token prefill, so the stage's check rejects the pass and says why."""
    import onnx

    _, proj = optimized
    for window, accepted in ((16, True), (4, False)):
        res = proj.run("optimize", "tiny-llama", "--set", f"optimize.options.group_query_attention.local_window={window}")
        assert res.code == 0, res.err
        manifest = json.loads((proj.folder(res) / "manifest.json").read_text())
        gqa = manifest["stages"]["optimize"]["meta"]["passes"][-1]
        assert (gqa["status"] == "accepted") == accepted, gqa
        if accepted:
            assert gqa["info"]["local_window"] == window
            graph = onnx.load(str(proj.folder(res) / "optimized.onnx"), load_external_data=False)
            windows = [a.i for n in graph.graph.node if n.op_type == "GroupQueryAttention"
                       for a in n.attribute if a.name == "local_window_size"]
            assert windows == [window] * LAYERS
        else:
            assert gqa["reason"], gqa
