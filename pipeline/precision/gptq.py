"""GPTQ (Frantar et al., 2022) for 4-bit blocks: weights rounded one input channel at a time,
each rounding's error spread over the channels not yet rounded, weighted by the layer's inputs.

For a linear layer y = x W with inputs X [tokens, K] seen on calibration data, the Hessian of
the output error is H = 2 X^T X / tokens [K, K]. Going through the input channels in order,
channel i is rounded to its block's grid and the others move by its error times
H^-1[i, j] / H^-1[i, i], which the upper Cholesky factor U of H^-1 (H^-1 = U^T U) gives row by
row without refactoring (the paper's form; 128 channels at a time, the rest updated once per
128). Each block of BLOCK input channels takes its scale and integer zero point from its
current (already corrected) weights when its first channel is reached: asymmetric, codes
0..15, as MLAS' fast int4 kernels take them (uint8 zero points, accuracy_level 4).

Why not ONNX Runtime's own GPTQ (MatMulNBitsQuantizer with GPTQWeightOnlyQuantConfig, 1.32):
it keeps weights [K, N] but indexes the Cholesky factor as the paper's [N, K] form does, so
every correction it applies is zero and it returns round-to-nearest (checked: its output
equals min/max RTN element for element on a random 128 x 64 layer with a correlated Hessian;
on SmolLM2 it answered 66/129 against RTN's 68). The Hessians are collected here in one run
per calibration feed (ORT's runs the whole graph once per layer per feed).
"""

from __future__ import annotations

import numpy as np

from pipeline.precision.integer_zero import set_blocks
from pipeline.precision.nibbles import unpack_nibbles

LEVELS = 15  # 4-bit codes 0..15
LAZY = 128  # channels rounded before the rest of the matrix is updated (the paper's B)
DAMP = 0.01  # share of H's mean diagonal added to it: X^T X of a few hundred tokens is singular


def hessians(model, weights: dict[str, str], feeds: list[dict]) -> tuple[dict[str, np.ndarray], int]:
    """H = 2 X^T X / tokens [K, K] for the input X of each MatMul in `weights` (node name ->
    weight initializer), keyed by the weight, from one run of the graph per feed; and the
    tokens seen."""
    import onnx
    import onnxruntime as ort

    inputs = {weights[n.name]: n.input[0] for n in model.graph.node if n.name in weights}
    names = list(dict.fromkeys(inputs.values()))
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=t) for t in names if t not in known)
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: ORT warns about every unused initializer
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    sums: dict[str, np.ndarray] = {}
    tokens = 0
    for feed in feeds:
        for tensor, x in zip(names, session.run(names, feed), strict=True):
            x = x.reshape(-1, x.shape[-1]).astype(np.float64)  # [tokens, K]
            sums[tensor] = sums[tensor] + x.T @ x if tensor in sums else x.T @ x
        tokens += len(x)
    return {weight: 2 * sums[tensor] / tokens for weight, tensor in inputs.items()}, tokens


def quantize(weight: np.ndarray, hessian: np.ndarray, block: int):
    """weight [K, N], its inputs' Hessian [K, K] -> codes [N, K/block, block] uint8, scales
    [N, K/block] float32, zero points [N, K/block] uint8."""
    k, n = weight.shape
    if k % block:
        raise ValueError(f"GPTQ needs K ({k}) to be a multiple of the block ({block})")
    w = weight.T.astype(np.float64)  # [N, K]: input channels are columns, as in the paper
    h = hessian.copy()
    dead = np.diag(h) == 0  # a channel no token uses: any value serves, 0 rounds exactly
    h[dead, dead] = 1
    w[:, dead] = 0
    h[np.diag_indices(k)] += DAMP * np.mean(np.diag(h))
    u = np.linalg.cholesky(np.linalg.inv(h)).T  # upper: H^-1 = u^T u
    codes = np.zeros((n, k), np.uint8)
    scales = np.zeros((n, k // block), np.float32)
    zeros = np.zeros((n, k // block), np.uint8)
    for start in range(0, k, LAZY):
        end = min(start + LAZY, k)
        part, errors = w[:, start:end].copy(), np.zeros((n, end - start))
        for i in range(end - start):
            column = start + i
            if column % block == 0:  # the block's grid, from its weights as corrected so far
                group = part[:, i:i + block]
                low, high = np.minimum(group.min(1), 0), np.maximum(group.max(1), 0)
                scale = np.where(high > low, (high - low) / LEVELS, 1.0)
                zero = np.round(-low / scale)
                scales[:, column // block], zeros[:, column // block] = scale, zero
            q = np.clip(np.round(part[:, i] / scale) + zero, 0, LEVELS)
            codes[:, column] = q
            error = (part[:, i] - (q - zero) * scale) / u[column, column]
            part[:, i:] -= np.outer(error, u[column, column:end])
            errors[:, i] = error
        w[:, end:] -= errors @ u[start:end, end:]
    return codes.reshape(n, k // block, block), scales, zeros


def _weighted_error(weight: np.ndarray, approx: np.ndarray, hessian: np.ndarray) -> tuple[float, float]:
    """(tr(D H D^T), tr(W H W^T)) for D = approx - weight, weights [K, N]: the layer's squared
    output error on the calibration inputs, and its output's squared norm."""
    d = (approx - weight).astype(np.float64)
    w = weight.astype(np.float64)
    return float(((hessian @ d) * d).sum()), float(((hessian @ w) * w).sum())


def apply(model, originals: dict[str, np.ndarray], hess: dict[str, np.ndarray], accuracy_level: int = 4) -> dict:
    """Every 4-bit MatMulNBits of `model` with uint8 zero points (ONNX Runtime's asymmetric
    round-to-nearest output) takes GPTQ's blocks for its float weight (`originals`: initializer
    name -> [K, N]; `hess`: its inputs' Hessian), in place. Returns the nodes done and the
    output error relative to the output, on the calibration inputs, before (RTN) and after."""
    from onnx import TensorProto, helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    before = after = norm = 0.0
    done = 0
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "MatMulNBits" or attrs.get("bits") != 4 or len(node.input) < 4:
            continue
        source = node.input[1].removesuffix("_Q4")
        if source not in originals or inits[node.input[3]].data_type != TensorProto.UINT8:
            raise ValueError(f"MatMulNBits {node.name}: no float weight {source!r} with uint8 zero points to replace")
        weight, block = originals[source], attrs["block_size"]
        codes, scales, zeros = quantize(weight, hess[source], block)
        rtn = _dequantize(numpy_helper.to_array(inits[node.input[1]]), numpy_helper.to_array(inits[node.input[2]]),
                          numpy_helper.to_array(inits[node.input[3]]), weight.shape)
        ours = ((codes.astype(np.float64) - zeros[..., None]) * scales[..., None]).reshape(weight.shape[1], -1).T
        (e_rtn, size), (e_ours, _) = (_weighted_error(weight, a, hess[source]) for a in (rtn, ours))
        before, after, norm = before + e_rtn, after + e_ours, norm + size
        set_blocks(node, inits, codes, scales, zeros, accuracy_level)
        done += 1
    return {"gptq_nodes": done, "accuracy_level": accuracy_level,
            "relative_output_error": {"rtn": round((before / max(norm, 1e-30)) ** 0.5, 5),
                                      "gptq": round((after / max(norm, 1e-30)) ** 0.5, 5)}}


def _dequantize(packed: np.ndarray, scales: np.ndarray, zeros: np.ndarray, shape: tuple) -> np.ndarray:
    """MatMulNBits' 4-bit blocks (packed [N, B, block/2], scales [N * B], packed zero points)
    -> the weight they stand for [K, N]."""
    k, n = shape
    blocks, block = packed.shape[1], 2 * packed.shape[2]
    codes = unpack_nibbles(packed, block).astype(np.float64)  # [N, B, block]
    z = unpack_nibbles(zeros.reshape(n, -1), blocks).astype(np.float64)  # [N, B]
    w = (codes - z[..., None]) * scales.reshape(n, blocks, 1)
    return w.reshape(n, -1)[:, :k].T
