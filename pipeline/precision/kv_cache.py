"""The KV cache's precision (`precision.kv_cache`): float32, float16 or int8 past/present tensors.

ONNX Runtime 1.32's CPU GroupQueryAttention computes in the graph's float type (T) but takes
its cache in a type of its own (T_CACHE): float16, or int8 with static scales (k_scale,
v_scale) per tensor or per channel, de-quantized as it attends and quantized as it appends.
Measured on one SmolLM2 attention at a 5,120-token past (benchmarks/results/kv-cache-*, 2
threads): the int8 cache reads a quarter of float32's bytes and attends in ~0.5x its time;
float16 has no fast path on this CPU (~8x slower), so it is offered for measuring, not as a win.

What this module does to a graph whose every present comes from a GroupQueryAttention:
- float16: the past/present types change; nothing else.
- int8: per-channel scales [1, KV, 1, hd] per layer and side, calibrated on the recipe's own
  text (the graph run with an empty past on `calibration` token ids; a key channel's scale
  covers its rotary pair's norm, since rotation moves magnitude between channels i and i+hd/2
  with the position), written as the attention's k_scale/v_scale inputs and, for the runners
  that feed a cache computed elsewhere (PyTorch's presents in validation), into the model's
  metadata (`pipeline.kv_cache`).
"""

from __future__ import annotations

import json

import numpy as np

from pipeline.core.cache_io import PAST, PRESENT
from pipeline.core.errors import StageFailed
from pipeline.core.json_object import JsonObject

KINDS = ("float32", "float16", "int8")
METADATA_KEY = "pipeline.kv_cache"
_ELEM = {"float16": 10, "int8": 3}  # onnx.TensorProto: FLOAT16, INT8
_NUMPY = {"float32": np.float32, "float16": np.float16, "int8": np.int8}
GQA_K_SCALE = 12  # GroupQueryAttention's inputs: ..., cos, sin, position_ids, bias, sink, k_scale, v_scale


def _attention_of_presents(model) -> list:
    """The GroupQueryAttention nodes that write the graph's presents from its pasts."""
    inputs = {i.name for i in model.graph.input}
    nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft"
             and n.input[3] in inputs and n.input[4] in inputs]
    presents = [o.name for o in model.graph.output if o.name.startswith(PRESENT)]
    written = {o for n in nodes for o in n.output[1:3]}
    if not nodes or not presents or set(presents) - written:
        raise StageFailed("precision.kv_cache: the graph's KV cache is not GroupQueryAttention's "
                          "(only its kernel takes a cache in another type)",
                          "add the group_query_attention pass to optimize.passes, or set "
                          "precision.kv_cache: float32")
    return nodes


def calibrate(model, token_ids: list[np.ndarray], nodes: list) -> dict[str, np.ndarray]:
    """Per-channel int8 scales [1, KV, 1, hd] for each past input: the graph (float cache) run
    on each [1, T] of `token_ids` from an empty past; the largest |value| per channel / 127."""
    import onnxruntime as ort

    pasts = [i for i in model.graph.input if i.name.startswith(PAST)]
    _, kv, _, hd = (d.dim_value for d in pasts[0].type.tensor_type.shape.dim)
    present = {n.input[j]: n.output[j - 2] for n in nodes for j in (3, 4)}  # past -> its present
    keys = {n.input[3] for n in nodes}
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: ORT warns about every unused initializer
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    peak = {p.name: np.zeros((1, kv, 1, hd), np.float32) for p in pasts}
    for ids in token_ids:
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                **{p.name: np.zeros((1, kv, 0, hd), np.float32) for p in pasts}}
        out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
        for name in peak:
            x = np.abs(out[present[name]])  # [1, KV, T, hd]
            if name in keys:  # a rotary pair (i, i + hd/2) shares its norm across positions
                half = hd // 2
                norm = np.sqrt(x[..., :half] ** 2 + x[..., half:] ** 2)
                x = np.concatenate([norm, norm], axis=-1)
            peak[name] = np.maximum(peak[name], x.max(axis=2, keepdims=True))
    return {name: np.maximum(p, 1e-6) / 127.0 for name, p in peak.items()}


def apply(model, kind: str, token_ids: list[np.ndarray]) -> JsonObject:
    """Rewrite `model` (onnx.ModelProto, KV-cache graph) in place for a `kind` cache; returns
    the precision stage's meta for it."""
    from onnx import helper, numpy_helper

    nodes = _attention_of_presents(model)
    meta: JsonObject = {"kv_cache": kind}
    if kind == "float32":
        return meta
    scales = calibrate(model, token_ids, nodes) if kind == "int8" else {}
    graph = model.graph
    for node in nodes if kind == "int8" else []:
        names = []
        for past in node.input[3:5]:
            init = numpy_helper.from_array(scales[past], f"{past}/scale")
            graph.initializer.append(init)
            names.append(init.name)
        node.input.extend([""] * (GQA_K_SCALE - len(node.input)) + names)
        quant = {"k_quant_type": "PER_CHANNEL", "v_quant_type": "PER_CHANNEL", "kv_cache_bit_width": 8}
        kept = [a for a in node.attribute if a.name not in quant]  # a saved engine spells out the defaults
        del node.attribute[:]
        node.attribute.extend([*kept, *(helper.make_attribute(k, v) for k, v in quant.items())])
    cache = {n.input[j] for n in nodes for j in (3, 4)} | {n.output[j] for n in nodes for j in (1, 2)}
    for value in [*graph.input, *graph.output]:
        if value.name in cache:
            value.type.tensor_type.elem_type = _ELEM[kind]
    stored = {"dtype": kind, "scales": {k: v.reshape(-1).tolist() for k, v in scales.items()}}
    helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props},
                                   METADATA_KEY: json.dumps(stored)})
    if kind == "int8":
        meta["kv_calibration"] = {"sequences": len(token_ids), "tokens": int(sum(t.size for t in token_ids)),
                               "scale_range": [float(min(s.min() for s in scales.values())),
                                               float(max(s.max() for s in scales.values()))]}
    meta["bytes_per_element"] = int(np.dtype(_NUMPY[kind]).itemsize)
    return meta


def cache_dtype(session) -> np.dtype:
    """The numpy type of a session's past inputs (float32 when it has none)."""
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8}
    past = next((i for i in session.get_inputs() if i.name.startswith(PAST)), None)
    return np.dtype(types.get(past.type, np.float32) if past is not None else np.float32)


class CacheCodec:
    """Float caches to an engine's cache type and back: a cache computed elsewhere (PyTorch's
    presents, random parity feeds) fed to an engine whose cache is float16 or int8, and its
    present.* outputs compared with PyTorch's in float32."""

    def __init__(self, dtype: np.dtype, scales: dict[str, list[float]]):
        self.dtype, self.scales = np.dtype(dtype), scales

    @classmethod
    def of_session(cls, session) -> CacheCodec:
        metadata = session.get_modelmeta().custom_metadata_map
        return cls(cache_dtype(session), json.loads(metadata.get(METADATA_KEY, "{}")).get("scales", {}))

    @classmethod
    def of_graph(cls, path) -> CacheCodec:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        stored = json.loads({p.key: p.value for p in model.metadata_props}.get(METADATA_KEY, "{}"))
        return cls(_NUMPY.get(stored.get("dtype"), np.float32), stored.get("scales", {}))

    def _scale(self, past: str, shape: tuple) -> np.ndarray:
        if past not in self.scales:
            raise StageFailed(f"the engine's int8 KV cache has no scales for {past} (model metadata "
                              f"{METADATA_KEY})", "rebuild the engine with --force")
        return np.asarray(self.scales[past], np.float32).reshape(1, shape[1], 1, shape[3])

    def feed(self, feed: dict) -> dict:
        """`feed` with its float past_key_values.* in the engine's cache type (int8: quantized
        with the engine's own scales, as its kernel quantizes what it appends)."""
        if self.dtype == np.float32:
            return feed
        out = dict(feed)
        for name, value in feed.items():
            if name.startswith(PAST) and value.dtype != self.dtype:
                out[name] = (np.clip(np.rint(value / self._scale(name, value.shape)), -127, 127).astype(np.int8)
                             if self.dtype == np.int8 else value.astype(self.dtype))
        return out

    def outputs(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`outputs` with the engine's present.* back in float32 (int8 de-quantized)."""
        if self.dtype == np.float32:
            return outputs
        out = dict(outputs)
        for name, value in outputs.items():
            if name.startswith(PRESENT) and value.dtype == self.dtype:
                past = PAST + name.removeprefix(PRESENT)
                out[name] = (value.astype(np.float32) * self._scale(past, value.shape)
                             if self.dtype == np.int8 else value.astype(np.float32))
        return out
