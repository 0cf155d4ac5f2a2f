"""HQQ's 4-bit blocks with integer zero points: the form MLAS' fast int4 kernels take.

ONNX Runtime's HQQ quantizer chooses each block's scale s and zero point z to minimize the
weight error (w ~ (q - z) * s, q in 0..15), but writes z as a float. MLAS' int4 kernels take
uint8 zero points only, so ONNX Runtime runs a float-zero-point MatMulNBits dequantized, in
fp32, every call (~11x slower a node: benchmarks/results/hqq-vs-rtn-2026-12-06.md).

Here each block keeps HQQ's choice as far as an integer zero point allows: z is rounded down
and up, and for each the codes and the scale are refit by alternating least squares with
the zero point fixed (q = round(w / s + z); s = sum(w t) / sum(t^2), t = q - z); the block
keeps whichever ends with the smaller squared error. The original float weights are the
target, not HQQ's reconstruction. The nodes then take accuracy_level 4 (int8 activations per
block, MLAS' fast path), as the checkpoint route's do.
"""

from __future__ import annotations

import numpy as np

from pipeline.precision.nibbles import pack_nibbles

# Alternating (codes, scale) steps. On SmolLM2's q|k|v weight the relative error goes 0.0902,
# 0.0860, 0.0821, 0.0814, 0.0813 over 0-4 steps, and is 0.0813 still at 8.
REFIT_STEPS = 4
LEVELS = 15  # 4-bit codes 0..15


def _refit(w: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, scale and error of blocks w [N, B, bs] with integer zero points `zero` [N, B, 1]."""
    q = np.clip(np.rint(w / scale + zero), 0, LEVELS)
    for _ in range(REFIT_STEPS):
        t = q - zero
        tt = (t * t).sum(-1, keepdims=True)
        # A block whose codes all sit on the zero point reconstructs 0 whatever s is: keep s.
        scale = np.where(tt > 0, (w * t).sum(-1, keepdims=True) / np.where(tt > 0, tt, 1), scale)
        scale = np.where(scale == 0, 1e-8, scale).astype(np.float32)
        q = np.clip(np.rint(w / scale + zero), 0, LEVELS)
    err = ((w - (q - zero) * scale) ** 2).sum(-1, keepdims=True)
    return q, scale, err


def integer_blocks(weight: np.ndarray, scale: np.ndarray, zero: np.ndarray, block: int):
    """weight [K, N] float; HQQ's scale and float zero [N * B] -> (codes [N, B, block] uint8,
    scales [N, B] float32, zero points [N, B] uint8, relative L2 error before and after)."""
    k, n = weight.shape
    nb = -(-k // block)
    w = np.zeros((n, nb * block), np.float32)
    w[:, :k] = weight.T
    w = w.reshape(n, nb, block)
    s = scale.reshape(n, nb, 1).astype(np.float32)
    z = zero.reshape(n, nb, 1).astype(np.float32)
    q_float = np.clip(np.rint(w / s + z), 0, LEVELS)
    before = float(((w - (q_float - z) * s) ** 2).sum())
    z_lo, z_hi = np.clip(np.floor(z), 0, LEVELS), np.clip(np.ceil(z), 0, LEVELS)
    # both integer neighbours of HQQ's zero point, refit; each block keeps the better
    (q_lo, s_lo, e_lo), (q_hi, s_hi, e_hi) = (_refit(w, s, z_int) for z_int in (z_lo, z_hi))
    higher = e_hi < e_lo
    q, s_fit, z_int, err = (np.where(higher, q_hi, q_lo), np.where(higher, s_hi, s_lo),
                            np.where(higher, z_hi, z_lo), np.minimum(e_hi, e_lo))
    norm = float((w * w).sum()) or 1.0
    return (q.astype(np.uint8), s_fit[..., 0], z_int[..., 0].astype(np.uint8),
            (before / norm) ** 0.5, (float(err.sum()) / norm) ** 0.5)


def set_blocks(node, inits: dict, codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray,
               accuracy_level: int) -> None:
    """A 4-bit MatMulNBits `node` with uint8 zero points takes codes [N, B, block] (0..15),
    scales [N, B] and zero points [N, B] in place of its own (initializers `inits` by name),
    and `accuracy_level`."""
    from onnx import helper, numpy_helper

    for index, array in ((1, pack_nibbles(codes)), (2, scales.reshape(-1).astype(np.float32)),
                         (3, pack_nibbles(zeros).reshape(-1))):
        inits[node.input[index]].CopyFrom(numpy_helper.from_array(array, node.input[index]))
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    del node.attribute[:]
    node.attribute.extend(helper.make_attribute(k, v) for k, v in {**attrs, "accuracy_level": accuracy_level}.items())


def asymmetric_nodes(model):
    """(node, its float weight's initializer name, block size) for each 4-bit MatMulNBits of
    `model` with zero points, as ONNX Runtime's asymmetric round-to-nearest writes them (the
    nodes GPTQ and AutoRound refill); ValueError where the zero points are not uint8."""
    from onnx import TensorProto, helper

    zero_types = {i.name: i.data_type for i in model.graph.initializer}
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "MatMulNBits" or attrs.get("bits") != 4 or len(node.input) < 4:
            continue
        if zero_types.get(node.input[3]) != TensorProto.UINT8:
            raise ValueError(f"MatMulNBits {node.name}: its zero points are not uint8")
        yield node, node.input[1].removesuffix("_Q4"), attrs["block_size"]


def to_integer_zero_points(model, originals: dict[str, np.ndarray], accuracy_level: int = 4) -> dict:
    """Every MatMulNBits of `model` (ORT's HQQ output) whose zero points are float -> uint8 zero
    points refit against `originals` (its weight initializer's name -> the float [K, N]), in
    place. Returns what changed: nodes and the weights' relative L2 error before and after."""
    from onnx import TensorProto, helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    errors_before, errors_after, sizes, done = [], [], [], 0
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or len(node.input) < 4 or node.input[3] not in inits:
            continue
        zp = inits[node.input[3]]
        if zp.data_type == TensorProto.UINT8:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        source = node.input[1].removesuffix(f"_Q{attrs['bits']}")
        if attrs["bits"] != 4 or source not in originals:
            raise ValueError(f"MatMulNBits {node.name}: no 4-bit float weight {source!r} to refit")
        q, scales, zeros, before, after = integer_blocks(
            originals[source], numpy_helper.to_array(inits[node.input[2]]), numpy_helper.to_array(zp),
            attrs["block_size"])
        set_blocks(node, inits, q, scales, zeros, accuracy_level)
        errors_before.append(before)
        errors_after.append(after)
        sizes.append(originals[source].size)
        done += 1
    weights = np.asarray(sizes, np.float64) / max(sum(sizes), 1)
    return {"integer_zero_nodes": done, "accuracy_level": accuracy_level,
            "relative_l2_error": {"float_zero_points": round(float(np.dot(weights, errors_before)), 5),
                                  "uint8_zero_points": round(float(np.dot(weights, errors_after)), 5)}}
