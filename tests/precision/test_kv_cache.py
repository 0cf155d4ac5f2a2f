"""The KV cache's precision (precision.kv_cache, pipeline/precision/kv_cache.py) on a real
GroupQueryAttention graph: a tiny Llama built once (random weights, GQA 4/2). The int8 cache's
graph takes and returns int8 caches with per-channel scales calibrated on its own run; the
IOBinding loop and the serving slots allocate it in its type (a quarter of float32's bytes);
rows at different lengths still decode as each alone; caches computed elsewhere (PyTorch's
float presents) go in through the engine's scales; a graph without GroupQueryAttention is
refused in one line; and `pipeline run --set precision.kv_cache=int8` builds, validates and
reports it end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import FAST_OPT, shared_build
from tests.serving.test_continuous_batching import RECIPE

pytestmark = pytest.mark.slow

EOS = 2


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    return shared_build(tmp_path_factory, "tiny-llama-gqa", "tiny-llama-gqa", *FAST_OPT,
                        recipes={"recipes/tiny-llama-gqa.yaml": RECIPE})


def _rewritten(gqa, tmp_path, kind: str):
    """The built fp32 engine with its cache in `kind`, calibrated on 3 x 40 random tokens."""
    import onnx

    from pipeline.precision import kv_cache

    model = onnx.load(str(gqa.built / "onnxruntime.onnx"))
    rng = np.random.default_rng(0)
    meta = kv_cache.apply(model, kind, [rng.integers(3, 256, size=(1, 40)) for _ in range(3)])
    path = tmp_path / f"{kind}.onnx"
    onnx.save(model, str(path))
    return path, model, meta


def _cosine(a, b) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_an_int8_cache_graph_takes_int8_caches_with_per_channel_scales(gqa, tmp_path):
    from onnx import TensorProto

    path, model, meta = _rewritten(gqa, tmp_path, "int8")
    assert meta["kv_cache"] == "int8" and meta["bytes_per_element"] == 1
    assert meta["kv_calibration"]["tokens"] == 120 and meta["kv_calibration"]["sequences"] == 3
    caches = [v for v in [*model.graph.input, *model.graph.output] if v.name.startswith(("past_key", "present."))]
    assert len(caches) == 8 and {v.type.tensor_type.elem_type for v in caches} == {TensorProto.INT8}
    attention = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    inits = {i.name: i for i in model.graph.initializer}
    for node in attention:
        attrs = {a.name: a for a in node.attribute}
        assert attrs["k_quant_type"].s == b"PER_CHANNEL" and attrs["kv_cache_bit_width"].i == 8
        k_scale, v_scale = node.input[12], node.input[13]
        assert list(inits[k_scale].dims) == [1, 2, 1, 16] and list(inits[v_scale].dims) == [1, 2, 1, 16]
    stored = json.loads({p.key: p.value for p in model.metadata_props}["pipeline.kv_cache"])
    key = np.asarray(stored["scales"]["past_key_values.0.key"]).reshape(2, 16)
    # a key channel's scale covers its rotary pair's norm: channels i and i + 8 share it
    np.testing.assert_array_equal(key[:, :8], key[:, 8:])
    assert (key > 0).all()


def test_the_loop_and_the_slots_keep_an_int8_cache_and_decode_like_float(gqa, tmp_path):
    """Greedy replies of the int8-cache engine agree with the float engine's on prompts of 3 to
    30 tokens (random weights: logits cosine >= 0.999), its buffers are int8, a quarter of the
    bytes per token; rows at different lengths decode in one call as each alone, bit for bit."""
    from pipeline.generation.runners import OrtLoopRunner
    from pipeline.generation.slots import BatchedSlots

    path, _, _ = _rewritten(gqa, tmp_path, "int8")
    floats = OrtLoopRunner(gqa.built / "onnxruntime.onnx", eos=EOS, threads=1)
    ints = OrtLoopRunner(path, eos=EOS, threads=1)
    assert ints.cache_dtype == np.int8 and floats.cache_dtype == np.float32
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 256, size=n) for n in (3, 17, 30)]
    f_slots, i_slots = BatchedSlots(floats, 1, 65), BatchedSlots(ints, 1, 65)
    assert {c.dtype for c in i_slots.caches.values()} == {np.dtype(np.int8)}
    assert i_slots.bytes_per_token * 4 == f_slots.bytes_per_token
    for prompt in prompts:
        f_slots, i_slots = BatchedSlots(floats, 1, 65), BatchedSlots(ints, 1, 65)
        a, b = f_slots.prefill(0, prompt), i_slots.prefill(0, prompt)
        step = rng.integers(3, 256, size=1)
        assert _cosine(a, b) > 0.999
        assert _cosine(f_slots.decode([0], step)[0], i_slots.decode([0], step)[0]) > 0.999
    alone = {}
    for slot, prompt in enumerate(prompts):
        one = BatchedSlots(ints, 1, 65)
        one.prefill(0, prompt)
        alone[slot] = one.decode([0], np.array([7]))[0]
    many = BatchedSlots(ints, 3, 65)
    for slot, prompt in enumerate(prompts):
        many.prefill(slot, prompt)
    for slot, row in zip(range(3), many.decode([0, 1, 2], np.array([7, 7, 7]))):
        np.testing.assert_array_equal(row, alone[slot])


def test_caches_computed_elsewhere_go_in_through_the_engines_scales(gqa, tmp_path):
    """The validate stage feeds PyTorch's float presents as the decode step's past: CacheCodec
    quantizes them with the engine's own scales, and returns the engine's int8 presents in
    float32, within a quantization step of the float engine's."""
    import onnxruntime as ort

    from pipeline.precision.kv_cache import CacheCodec
    from pipeline.workloads.generation_accuracy import run_feed

    path, _, _ = _rewritten(gqa, tmp_path, "int8")
    names = ["logits", *(f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value"))]
    floats = ort.InferenceSession(str(gqa.built / "onnxruntime.onnx"), providers=["CPUExecutionProvider"])
    ints = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(6)
    prefill = {"input_ids": rng.integers(3, 256, size=(1, 12)), "attention_mask": np.ones((1, 12), np.int64),
               **{f"past_key_values.{i}.{kv}": np.zeros((1, 2, 0, 16), np.float32) for i in range(2) for kv in ("key", "value")}}
    first = run_feed(floats, prefill, names)
    decode = {"input_ids": np.array([[9]]), "attention_mask": np.ones((1, 13), np.int64),
              **{f"past_key_values.{n[8:]}": first[n] for n in names[1:]}}
    want, got = run_feed(floats, decode, names), run_feed(ints, decode, names)
    codec = CacheCodec.of_session(ints)
    for name in names[1:]:
        assert got[name].dtype == np.float32 and got[name].shape == want[name].shape
        step = np.asarray(codec.scales["past_key_values." + name[8:]]).reshape(1, 2, 1, 16)
        # the past comes back as the codec quantized it, per channel (the scales' layout is
        # the kernel's: [1, KV, 1, hd]); the new token's row went through a layer that read
        # the rounded past
        rounded = np.clip(np.rint(want[name] / step), -127, 127) * step
        np.testing.assert_allclose(got[name][:, :, :12], rounded[:, :, :12], rtol=1e-6, atol=1e-7)
        assert _cosine(got[name], want[name]) > 0.999
    assert _cosine(got["logits"], want["logits"]) > 0.999


def test_a_float16_cache_runs_and_a_graph_without_gqa_is_refused(gqa, tmp_path):
    import onnx

    from pipeline.core.errors import StageFailed
    from pipeline.generation.runners import OrtLoopRunner
    from pipeline.precision import kv_cache

    path, _, meta = _rewritten(gqa, tmp_path, "float16")
    assert meta == {"kv_cache": "float16", "bytes_per_element": 2}
    loop = OrtLoopRunner(path, eos=EOS, threads=1)
    floats = OrtLoopRunner(gqa.built / "onnxruntime.onnx", eos=EOS, threads=1)
    prompt = np.arange(3, 20)[None]
    for runner in (loop, floats):
        runner.new(1)
    assert loop.cache_dtype == np.float16
    assert (loop.prefill(prompt) == floats.prefill(prompt)).all()
    exported = onnx.load(str(gqa.built / "model.onnx"))  # ONNX Attention, a concatenating cache
    with pytest.raises(StageFailed, match="group_query_attention pass"):
        kv_cache.apply(exported, "int8", [])


def test_pipeline_run_builds_validates_and_reports_an_int8_cache(tmp_path_factory):
    proj = shared_build(tmp_path_factory, "tiny-llama-gqa-kv8", "tiny-llama-gqa", *FAST_OPT,
                        "--set", "precision.kv_cache=int8",
                        "--set", "validate.tolerance={cosine_min: 0.95, top1_min: 0.5}",
                        recipes={"recipes/tiny-llama-gqa.yaml": RECIPE})
    report = json.loads((proj.built / "report.json").read_text())
    text = (proj.built / "report.md").read_text()
    assert "- KV cache: **int8** (1 bytes an element, float32's 4); per-channel scales calibrated" in text
    assert f"Engine file: {report['engines'][0]['bytes'] / 1e6:.1f} MB (`onnxruntime.onnx`)." in text
    memory = report["engines"][0]["generation"]["memory"]
    assert memory["kv_cache_bytes_per_token"] == 2 * 2 * 2 * 16  # layers x (K, V) x KV heads x hd, 1 byte
