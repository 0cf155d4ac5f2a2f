"""Passes built on onnx and onnxscript: shape inference, folding, rewrites, ORT fusions.

Each takes and returns an onnx.ModelProto (see pipeline/passes/__init__.py). onnxscript's
passes work on its IR; the conversion both ways is lossless for what the exporters produce.
"""

from __future__ import annotations

FusionFunctions = dict[str, str]  # fusion (as ort_fusions counts it) -> the function applying it


def _ir(model):
    import onnx_ir as ir

    return ir, ir.from_proto(model)


def shape_inference(model):
    import onnx

    # data_prop propagates Shape -> Gather -> Concat values, so reshapes get static ranks.
    return onnx.shape_inference.infer_shapes(model, check_type=True, data_prop=True)


def fold_constants(model, input_size_limit: int = 8192):
    """Constant folding and dead-node elimination (onnxscript.optimizer)."""
    import onnxscript

    ir, m = _ir(model)
    onnxscript.optimizer.optimize(m, input_size_limit=int(input_size_limit))
    return ir.to_proto(m)


def rewrite(model):
    """onnxscript's default rewrite rules (e.g. cast/reshape/transpose simplifications)."""
    import onnxscript

    ir, m = _ir(model)
    onnxscript.rewriter.rewrite(m)
    return ir.to_proto(m)


def ort_fusions(model, skip: list[str] | tuple[str, ...] = ()):
    """Fusions for ONNX Runtime: SDPA -> (Multi-Head / Group-Query) Attention, (Skip)
    LayerNorm/RMSNorm, GELU / BiasGelu, rotary embedding. Returns the fusion counts onnxscript
    reports.

    `skip` names fusions to leave out (the keys of the counts, e.g. "gqa"). onnxscript has no
    switch for that, so each skipped fusion function is replaced by one that fuses nothing
    for the duration of the call. Why one would: onnxscript 0.7's GQA fusion takes the
    block-sparse mask of the flash GLM for a causal one and fuses it into GroupQueryAttention,
    which attends causally: the logits move (cosine 0.991) and the stage's check rejects the
    whole pass, attention and norm fusions included.
    """
    import contextlib

    from onnxscript.rewriter import ort_fusions as fusions
    from onnxscript.rewriter.ort_fusions import _core

    functions = _fusion_functions()
    check_ort_fusions(skip)
    renamed = rms_as_simplified_layer_norm(model)
    ir, m = _ir(model)
    with contextlib.ExitStack() as stack:
        for name in skip:
            original = getattr(_core, functions[name])
            setattr(_core, functions[name], lambda model, debug=False, **kwargs: 0)
            stack.callback(setattr, _core, functions[name], original)
        m, counts = fusions.optimize_for_ort(m)
    out = ir.to_proto(m)
    packed = pack_constant_concats(out)
    return out, {"rules_applied": {k: v for k, v in counts.items() if v},
                 **({"rms_as_simplified_layer_norm": renamed} if renamed else {}),
                 **({"skipped": list(skip)} if skip else {}),
                 **({"constant_concats_packed": packed} if packed else {})}


def _fusion_functions() -> FusionFunctions:
    """fusion (as ort_fusions counts it) -> the function of onnxscript's ort_fusions._core
    that applies it."""
    from onnxscript.rewriter.ort_fusions import _core

    functions = {name[len("fuse_"):]: name for name in dir(_core)
                 if name.startswith("fuse_") and name != "fuse_xformers"}
    functions.update(packed_qkv_for_gqa="fuse_qkv_gqa", erf_gelu="fuse_erfgelu")
    return functions


def check_ort_fusions(skip: list[str] | tuple[str, ...] = ()) -> None:
    """ort_fusions' options, checked before any work (the optimize stage's preflight): every
    fusion named in `skip` is one onnxscript applies."""
    if not skip:
        return
    functions = _fusion_functions()
    unknown = sorted(set(skip) - set(functions))
    if unknown:
        from pipeline.core.errors import RecipeError

        raise RecipeError(f"optimize.options.ort_fusions.skip: unknown fusion {', '.join(unknown)}",
                          f"known: {', '.join(sorted(functions))}")


def pack_constant_concats(model) -> int:
    """Replace each Concat of initializers by one initializer, in place; returns how many.

    The attention fusion packs the q/k/v projection weights and biases as Concat nodes over
    the three initializers, and onnxscript's folding leaves them (input_size_limit: 384 x 384
    is over it). ONNX Runtime folds them when a session starts, so FP32 loses nothing, but
    INT8 quantizers see a computed weight and leave the projection in float: on MiniLM the
    fused Attention (QKV projection in float) took ~47% of the dynamic INT8 engine's kernel
    time, against ~18% for the attention products in the peer's per-MatMul INT8 graph.
    """
    import numpy as np
    from onnx import numpy_helper

    initializers = {i.name: i for i in model.graph.initializer}
    readers: dict[str, int] = {}
    for n in model.graph.node:
        for name in n.input:
            readers[name] = readers.get(name, 0) + 1
    kept, packed = [], 0
    for n in model.graph.node:
        if n.op_type == "Concat" and n.input and all(i in initializers for i in n.input):
            axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
            arrays = [numpy_helper.to_array(initializers[i]) for i in n.input]
            model.graph.initializer.append(numpy_helper.from_array(np.concatenate(arrays, axis), n.output[0]))
            for name in n.input:  # drop the parts nobody else reads
                readers[name] -= 1
            packed += 1
            continue
        kept.append(n)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    unused = {k for k, v in readers.items() if v == 0 and k in initializers}
    live = [i for i in model.graph.initializer if i.name not in unused]
    del model.graph.initializer[:]
    model.graph.initializer.extend(live)
    return packed


def rms_as_simplified_layer_norm(model) -> int:
    """ONNX RMSNormalization (opset 23, what the dynamo exporter writes for RMS norms) renamed
    to ONNX Runtime's SimplifiedLayerNormalization, in place; returns how many.

    The two compute the same (x / sqrt(mean(x^2) + epsilon) * scale over `axis`, in the
    `stash_type` precision) with the same attributes, and ORT registers its op in the default
    domain. onnxscript's skip-norm fusion knows ORT's op only: renamed, each norm that reads a
    residual Add becomes one SkipSimplifiedLayerNormalization (the add and the norm in one pass
    over the activation, the genai builder's form).
    """
    renamed = 0
    for node in model.graph.node:
        if node.op_type == "RMSNormalization" and node.domain in ("", "ai.onnx"):
            node.op_type, node.domain = "SimplifiedLayerNormalization", ""
            renamed += 1
    return renamed
