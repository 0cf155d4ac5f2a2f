"""group_query_attention: ONNX Attention with past + its rotary embeddings -> ORT's GroupQueryAttention.

After `attention_with_past`, a Llama-family block at opset 23 reads (per layer, shapes for
batch B, new tokens S, query heads H, K/V heads KV, head size hd):

    q3 [B, S, H*hd]  -> Reshape [B, S, H, hd]  -> Transpose [B, H, S, hd]  -> RotaryEmbedding(cos, sin)
    k3 [B, S, KV*hd] -> Reshape                -> Transpose [B, KV, S, hd] -> RotaryEmbedding(cos, sin)
    v3 [B, S, KV*hd] -> Reshape                -> Transpose [B, KV, S, hd]
    Attention(q, k, v, mask, past_k, past_v) -> (out [B, H, S, hd], present_k, present_v)
    out -> Transpose [B, S, H, hd] -> Reshape [B, S, H*hd]

ONNX Runtime's contrib op GroupQueryAttention (what onnxruntime-genai's model builder writes)
does all of it in one kernel: it takes the 3-D projections (or the packed q|k|v MatMul output
of `pack_matmuls`), rotates q and k itself from cos/sin tables indexed by position, appends
to the cache and attends, returning [B, S, H*hd]: 9-12 nodes per layer become one, and the
rotations and transposes no longer write tensors to memory. onnxscript's GQA fusion matches
the decomposed form of lower opsets (MatMul/Softmax SDPA, rotate-half rotary, its own causal
mask pattern), not this one, so the rewrite is done here on the opset-23 ops.

What it assumes, as GroupQueryAttention does: the attention mask is causal plus padding on
the right only (`seqlens_k` = ones in the mask - 1), which is how onnxruntime-genai and the
pipeline's runners feed it; positions are past + 0..S-1. The cos/sin tables are the graph's
own cos/sin computation evaluated at positions 0..max_positions-1 (and checked to depend on
the position alone); a context beyond max_positions fails in the kernel, never silently.
The optimize stage checks the result against its input graph like any pass.
"""

from __future__ import annotations

import numpy as np

from pipeline.core.cache_io import PAST

MS = "com.microsoft"


def _attr(node, name, default=None):
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


class _Graph:
    """Producers and consumers of one graph's values."""

    def __init__(self, graph):
        self.graph = graph
        self.producer = {o: n for n in graph.node for o in n.output}
        self.readers: dict[str, list] = {}
        for n in graph.node:
            for name in n.input:
                self.readers.setdefault(name, []).append(n)

    def made_by(self, name: str, op: str):
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op and node.domain in ("", "ai.onnx") else None

    def only_reader(self, name: str, op: str):
        readers = self.readers.get(name, [])
        ok = len(readers) == 1 and readers[0].op_type == op and name not in {o.name for o in self.graph.output}
        return readers[0] if ok else None


def _heads_in(g: _Graph, name: str, rotary: bool):
    """(3-D projection, rotary node or None) when `name` is [Rotary](Transpose(Reshape(x)))."""
    rot = g.made_by(name, "RotaryEmbedding") if rotary else None
    if rotary and (rot is None or len(rot.input) != 3 or _attr(rot, "rotary_embedding_dim", 0)):
        return None
    transpose = g.made_by(rot.input[0] if rotary else name, "Transpose")
    if transpose is None or list(_attr(transpose, "perm", [])) != [0, 2, 1, 3]:
        return None
    reshape = g.made_by(transpose.input[0], "Reshape")
    return (reshape.input[0], rot) if reshape is not None else None


def _match(g: _Graph, att):
    """The parts of one Attention-with-past block, or None if it is not this exact form."""
    if len(att.input) != 6 or not (att.input[4] and att.input[5]) or len(att.output) != 3:
        return None
    if _attr(att, "softcap", 0.0) or _attr(att, "qk_matmul_output_mode", 0):
        return None
    q, k, v = (_heads_in(g, att.input[i], rotary=i < 2) for i in range(3))
    if q is None or k is None or v is None or q[1].input[1:] != k[1].input[1:]:
        return None
    if _attr(q[1], "interleaved", 0) != _attr(k[1], "interleaved", 0) or not _attr(q[1], "num_heads"):
        return None
    back = g.only_reader(att.output[0], "Transpose")
    if back is None or list(_attr(back, "perm", [])) != [0, 2, 1, 3]:
        return None
    out = g.only_reader(back.output[0], "Reshape")
    return None if out is None else (q, k, v, out)


def _rotary_tables(model, cos: str, sin: str, kv_heads: int, head_dim: int, n: int):
    """(cos [n, hd/2], sin [n, hd/2]): the graph's own cos/sin at positions 0..n-1, evaluated on
    the subgraph that computes them; checked to be a function of the position alone (the
    same rows come back for a prompt that starts after a past)."""
    import onnxruntime as ort
    from onnx import utils

    inputs = [i.name for i in model.graph.input]
    sub = utils.Extractor(model).extract_model(inputs, [cos, sin])
    sess = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}

    def run(past: int, new: int):
        feed = {"input_ids": np.zeros((1, new), np.int64), "attention_mask": np.ones((1, past + new), np.int64)}
        feed.update({i.name: np.zeros((1, kv_heads, past, head_dim), np.float32)
                     for i in model.graph.input if i.name.startswith(PAST)})
        return sess.run(None, {k: v for k, v in feed.items() if k in names})

    c, s = (np.asarray(t, np.float32).reshape(n, -1) for t in run(0, n))
    c2, s2 = (np.asarray(t, np.float32).reshape(5, -1) for t in run(3, 5))
    if not (np.allclose(c2, c[3:8], atol=1e-6) and np.allclose(s2, s[3:8], atol=1e-6)):
        raise ValueError("the rotary cos/sin do not depend on the position alone")
    return c, s


def group_query_attention(model, max_positions: int = 8192, local_window: int | None = None):
    """Rewrite in place; returns (model, {"group_query_attention": blocks, "packed_qkv": of them}).
    `local_window`: each query attends to the last `local_window` keys only (itself included;
    GQA's local_window_size, a sliding window): sparse attention as "flash" variants use it,
    which changes results once a context outgrows it (the stage's check at the recipe's
    longest shape then judges it like any pass)."""
    from onnx import helper, numpy_helper

    from pipeline.passes.attention import drop_dead

    graph = model.graph
    g = _Graph(graph)
    past = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
    blocks = [(att, m) for att in graph.node if att.op_type == "Attention" and att.domain in ("", "ai.onnx")
              for m in [_match(g, att)] if m is not None]
    if not blocks or "attention_mask" not in past:
        return model, {"group_query_attention": 0}
    pre, consts = _shared_inputs()
    tables: dict[tuple[str, str], tuple[str, str]] = {}
    packed = 0
    for i, (att, (q, k, v, out)) in enumerate(blocks):
        kv_heads, head_dim = past[att.input[4]][1], past[att.input[4]][3]
        cos, sin = q[1].input[1], q[1].input[2]
        if (cos, sin) not in tables:
            c, s = _rotary_tables(model, cos, sin, kv_heads, head_dim, int(max_positions))
            names = (f"gqa/cos_cache_{len(tables)}", f"gqa/sin_cache_{len(tables)}")
            consts += [numpy_helper.from_array(c, names[0]), numpy_helper.from_array(s, names[1])]
            tables[(cos, sin)] = names
        node, reads_packed = _gqa_node(g, i, att, (q, k, v, out), kv_heads, tables[(cos, sin)], local_window)
        packed += reads_packed
        position = list(graph.node).index(att)
        graph.node.insert(position, node)
        out.output[0] = f"gqa/replaced_{i}"  # the old tail now produces nothing anyone reads
        att.output[1] = f"gqa/replaced_present_k_{i}"
        att.output[2] = f"gqa/replaced_present_v_{i}"
    for n in reversed(pre):
        graph.node.insert(0, n)
    graph.initializer.extend(consts)
    drop_dead(graph)
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    # No onnx.checker here: ORT's ops in the default domain (SimplifiedLayerNormalization, from
    # ort_fusions) are unknown to it; the stage's ORT session is the judge of the graph.
    return model, {"group_query_attention": len(blocks), "packed_qkv": packed,
                   "rotary_tables": len(tables), "max_positions": int(max_positions),
                   **({"local_window": int(local_window)} if local_window else {})}


def _shared_inputs() -> tuple[list, list]:
    """(nodes, initializers) of the inputs every GQA node shares, computed once (as the genai
    builder does): seqlens_k [B] int32 = tokens - 1, total_sequence_length int32 scalar = the
    mask's length."""
    from onnx import helper, numpy_helper

    pre = [
        helper.make_node("ReduceSum", ["attention_mask", "gqa/axis1"], ["gqa/tokens"], keepdims=0),
        helper.make_node("Sub", ["gqa/tokens", "gqa/one"], ["gqa/last"]),
        helper.make_node("Cast", ["gqa/last"], ["gqa/seqlens_k"], to=6),
        helper.make_node("Shape", ["attention_mask"], ["gqa/mask_shape"], start=1, end=2),
        helper.make_node("Squeeze", ["gqa/mask_shape"], ["gqa/total64"]),
        helper.make_node("Cast", ["gqa/total64"], ["gqa/total_len"], to=6),
    ]
    consts = [numpy_helper.from_array(np.array([1], np.int64), "gqa/axis1"),
              numpy_helper.from_array(np.array(1, np.int64), "gqa/one")]
    return pre, consts


def _gqa_node(g: _Graph, i: int, att, parts: tuple, kv_heads: int, table: tuple[str, str],
              local_window: int | None = None):
    """(the GroupQueryAttention node replacing block `i`, whether it reads the packed q|k|v
    projection): it writes the block's output and present key/value under their names."""
    from onnx import helper

    q, k, v, out = parts
    qkv = [q[0], k[0], v[0]]
    split = g.producer.get(q[0])
    packed = (split is not None and split.op_type == "Split" and list(split.output) == qkv
              and all(len(g.readers.get(x, [])) == 1 for x in qkv))
    if packed:
        qkv = [split.input[0], "", ""]  # the packed q|k|v projection, read by GQA as is
    attrs = dict(num_heads=int(_attr(q[1], "num_heads")), kv_num_heads=int(kv_heads), do_rotary=1,
                 rotary_interleaved=int(_attr(q[1], "interleaved", 0)))
    scale = _attr(att, "scale")
    if scale is not None:
        attrs["scale"] = float(scale)
    if local_window:
        attrs["local_window_size"] = int(local_window)
    node = helper.make_node(
        "GroupQueryAttention",
        [*qkv, att.input[4], att.input[5], "gqa/seqlens_k", "gqa/total_len", *table],
        [out.output[0], att.output[1], att.output[2]], name=f"gqa/{att.name or i}", domain=MS, **attrs)
    return node, packed
