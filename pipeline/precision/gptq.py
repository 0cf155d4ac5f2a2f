"""GPTQ (Frantar et al., 2022) for 4-bit blocks: weights rounded one input channel at a time,
each rounding's error spread over the channels not yet rounded, weighted by the layer's inputs.

For a linear layer y = x W with inputs X [tokens, K] seen on calibration data, the Hessian of
the output error is H = 2 X^T X / tokens [K, K]. Going through the input channels in order,
channel i is rounded to its block's grid and the others move by its error times
H^-1[i, j] / H^-1[i, i], which the upper Cholesky factor U of H^-1 (H^-1 = U^T U) gives row by
row without refactoring (the paper's form; 128 channels at a time, the rest updated once per
128). Each block of input channels takes its scale and integer zero point from its current
(already corrected) weights when its first channel is reached: asymmetric, codes 0..15, as
MLAS' fast int4 kernels take them (uint8 zero points, accuracy_level 4).

The recipe's precision.gptq chooses the rest: the channels in order of falling Hessian diagonal
with every block's grid fixed beforehand (act_order, "static groups"), a grid searched for the
least weighted rounding error (grid: search), the damping, and Hessians taken in the paper's
sequential order (each layer's inputs after the layers before it are rounded).

Why not ONNX Runtime's own GPTQ (MatMulNBitsQuantizer with GPTQWeightOnlyQuantConfig, 1.32):
it keeps weights [K, N] but indexes the Cholesky factor as the paper's [N, K] form does, so
every correction it applies is zero and it returns round-to-nearest (checked: its output
equals min/max RTN element for element on a random 128 x 64 layer with a correlated Hessian;
on SmolLM2 it answered 66/129 against RTN's 68). The Hessians are collected here in one run
per calibration feed (ORT's runs the whole graph once per layer per feed).
"""

from __future__ import annotations

import numpy as np

from pipeline.precision.integer_zero import asymmetric_nodes, set_blocks
from pipeline.precision.nibbles import unpack_nibbles

LEVELS = 15  # 4-bit codes 0..15
LAZY = 128  # channels rounded before the rest of the matrix is updated (the paper's B)
SHRINKS = np.linspace(1.0, 0.6, 21)  # grid: search -- the share of a block's range tried


def _probe(model, inputs: dict[str, str]):
    """The graph with every MatMul input in `inputs` (weight -> input tensor) made an output,
    serialized, and the output names."""
    import onnx

    names = list(dict.fromkeys(inputs.values()))
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=t) for t in names if t not in known)
    return probe.SerializeToString(), names


def _run_hessians(serialized: bytes, names: list[str], feeds: list[dict], replaced: dict[str, np.ndarray]):
    """sum X^T X per tensor in `names` over `feeds`, the graph's weights in `replaced`
    overridden (initializer name -> array); and the tokens seen."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: ORT warns about every unused initializer
    values = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in replaced.items()}
    for name, value in values.items():  # kept alive in `values` while the session is built
        options.add_initializer(name, value)
    session = ort.InferenceSession(serialized, options, providers=["CPUExecutionProvider"])
    sums: dict[str, np.ndarray] = {}
    tokens = 0
    for feed in feeds:
        for tensor, x in zip(names, session.run(names, feed), strict=True):
            x = x.reshape(-1, x.shape[-1]).astype(np.float64)  # [tokens, K]
            sums[tensor] = sums[tensor] + x.T @ x if tensor in sums else x.T @ x
        tokens += len(x)
    return sums, tokens


def hessians(model, weights: dict[str, str], feeds: list[dict], spec=None,
             originals: dict[str, np.ndarray] | None = None, block: int = 32):
    """H = 2 X^T X / tokens [K, K] for the input X of each MatMul in `weights` (node name ->
    weight initializer), keyed by the weight; the tokens seen; and the blocks already solved
    (weight -> codes, scales, zeros; sequential only).

    One run of the float graph per feed; or (spec.sequential) the paper's order: the layers in
    graph order, `spec.sequential` at a time, each group's inputs taken with every layer before
    it already GPTQ-rounded (its de-quantized weight in place of the float one), so a layer
    corrects for the error its inputs carry, not only for its own rounding."""
    inputs = {weights[n.name]: n.input[0] for n in model.graph.node if n.name in weights}
    serialized, names = _probe(model, inputs)
    step = spec.sequential if spec is not None else 0
    if not step:
        sums, tokens = _run_hessians(serialized, names, feeds, {})
        return {weight: 2 * sums[tensor] / tokens for weight, tensor in inputs.items()}, tokens, {}
    order = list(inputs)  # graph order: each weight after everything it depends on
    hess: dict[str, np.ndarray] = {}
    solved: dict[str, tuple] = {}
    rounded: dict[str, np.ndarray] = {}
    for start in range(0, len(order), step):
        group = order[start:start + step]
        sums, tokens = _run_hessians(serialized, list(dict.fromkeys(inputs[w] for w in group)), feeds, rounded)
        for weight in group:
            hess[weight] = 2 * sums[inputs[weight]] / tokens
            solved[weight] = quantize(originals[weight], hess[weight], block, **_options(spec))
            rounded[weight] = np.ascontiguousarray(weight_of(*solved[weight], originals[weight].shape), np.float32)
    return hess, tokens, solved


def _options(spec) -> dict:
    """quantize()'s keyword arguments from a recipe's precision.gptq."""
    return {} if spec is None else {"act_order": spec.act_order, "search": spec.grid == "search",
                                    "damp": spec.damp}


def weight_of(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray, shape: tuple) -> np.ndarray:
    """The weight [K, N] that blocks (codes [N, B, block], scales and zero points [N, B]) stand for."""
    return ((codes.astype(np.float64) - zeros[..., None]) * scales[..., None]).reshape(shape[1], -1).T


def _grid(group: np.ndarray, importance: np.ndarray, search: bool):
    """Scale and integer zero point [rows] for each row of `group` [rows, block]: its min/max
    range (0 included), or (search) that range shrunk by the factor in SHRINKS with the least
    rounding error weighted by `importance` [block] (the Hessian's diagonal)."""
    low, high = np.minimum(group.min(1), 0), np.maximum(group.max(1), 0)
    best_scale = best_zero = best_error = None
    for shrink in SHRINKS if search else (1.0,):
        scale = np.where(high > low, (high - low) * shrink / LEVELS, 1.0)
        zero = np.round(-low * shrink / scale)
        q = np.clip(np.round(group / scale[:, None]) + zero[:, None], 0, LEVELS)
        error = (((q - zero[:, None]) * scale[:, None] - group) ** 2 * importance).sum(1)
        if best_error is None:
            best_scale, best_zero, best_error = scale, zero, error
        else:
            better = error < best_error
            best_scale, best_zero = np.where(better, scale, best_scale), np.where(better, zero, best_zero)
            best_error = np.minimum(error, best_error)
    return best_scale, best_zero


def round_to_nearest(weight: np.ndarray, block: int):
    """weight [K, N] -> codes, scales, zero points as quantize() returns them, each block
    rounded on its min/max grid with no correction: the baseline GPTQ is judged against (ONNX
    Runtime's asymmetric RTN writes the same grid)."""
    k, n = weight.shape
    groups = weight.T.astype(np.float64).reshape(n * (k // block), block)
    scale, zero = _grid(groups, np.ones(block), search=False)
    codes = np.clip(np.round(groups / scale[:, None]) + zero[:, None], 0, LEVELS)
    return (codes.astype(np.uint8).reshape(n, k // block, block),
            scale.astype(np.float32).reshape(n, k // block), zero.astype(np.uint8).reshape(n, k // block))


def quantize(weight: np.ndarray, hessian: np.ndarray, block: int, act_order: bool = False,
             search: bool = False, damp: float = 0.01):
    """weight [K, N], its inputs' Hessian [K, K] -> codes [N, K/block, block] uint8, scales
    [N, K/block] float32, zero points [N, K/block] uint8.

    act_order: channels rounded in order of falling Hessian diagonal (the most used first,
    while the most channels are left to take their error), each block's grid set beforehand
    from the uncorrected weights, since a block is contiguous along K in MatMulNBits and its
    channels are no longer reached together. search: see _grid. damp: the share of the mean
    diagonal added to H before it is inverted."""
    k, n = weight.shape
    if k % block:
        raise ValueError(f"GPTQ needs K ({k}) to be a multiple of the block ({block})")
    w = weight.T.astype(np.float64)  # [N, K]: input channels are columns, as in the paper
    h = hessian.copy()
    dead = np.diag(h) == 0  # a channel no token uses: any value serves, 0 rounds exactly
    h[dead, dead] = 1
    w[:, dead] = 0
    diag = np.diag(h).copy()
    scales = np.zeros((n, k // block), np.float32)
    zeros = np.zeros((n, k // block), np.uint8)
    if act_order:  # static groups: every block's grid from the weights before any correction
        for b in range(k // block):
            channels = slice(b * block, (b + 1) * block)
            scales[:, b], zeros[:, b] = _grid(w[:, channels], diag[channels], search)
        order = np.argsort(-diag, kind="stable")
    else:
        order = np.arange(k)
    w, h = w[:, order], h[np.ix_(order, order)]
    h[np.diag_indices(k)] += damp * np.mean(np.diag(h))
    u = np.linalg.cholesky(np.linalg.inv(h)).T  # upper: H^-1 = u^T u
    codes = np.zeros((n, k), np.uint8)
    for start in range(0, k, LAZY):
        end = min(start + LAZY, k)
        part, errors = w[:, start:end].copy(), np.zeros((n, end - start))
        for i in range(end - start):
            column = start + i
            original = order[column]
            if not act_order and column % block == 0:  # the block's grid, from its weights as corrected so far
                scales[:, column // block], zeros[:, column // block] = _grid(
                    part[:, i:i + block], diag[column:column + block], search)
            scale = scales[:, original // block].astype(np.float64)
            zero = zeros[:, original // block].astype(np.float64)
            q = np.clip(np.round(part[:, i] / scale) + zero, 0, LEVELS)
            codes[:, original] = q
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


def apply(model, originals: dict[str, np.ndarray], hess: dict[str, np.ndarray], spec=None,
          solved: dict[str, tuple] | None = None, accuracy_level: int = 4) -> dict:
    """Every 4-bit MatMulNBits of `model` with uint8 zero points (ONNX Runtime's asymmetric
    round-to-nearest output) takes GPTQ's blocks for its float weight (`originals`: initializer
    name -> [K, N]; `hess`: its inputs' Hessian), in place. Returns the nodes done and the
    output error relative to the output, on the calibration inputs, before (RTN) and after."""
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    before = after = norm = 0.0
    done = 0
    for node, source, block in asymmetric_nodes(model):
        if source not in originals:
            raise ValueError(f"MatMulNBits {node.name}: no float weight {source!r} to replace")
        weight = originals[source]
        if solved and source in solved:  # sequential: rounded while the Hessians were taken
            codes, scales, zeros = solved[source]
        else:
            codes, scales, zeros = quantize(weight, hess[source], block, **_options(spec))
        rtn = _dequantize(numpy_helper.to_array(inits[node.input[1]]), numpy_helper.to_array(inits[node.input[2]]),
                          numpy_helper.to_array(inits[node.input[3]]), weight.shape)
        ours = weight_of(codes, scales, zeros, weight.shape)
        (e_rtn, size), (e_ours, _) = (_weighted_error(weight, a, hess[source]) for a in (rtn, ours))
        before, after, norm = before + e_rtn, after + e_ours, norm + size
        set_blocks(node, inits, codes, scales, zeros, accuracy_level)
        done += 1
    settings = {} if spec is None else {"gptq": spec.model_dump()}
    return {"gptq_nodes": done, "accuracy_level": accuracy_level, **settings,
            "relative_output_error": {"rtn": round((before / max(norm, 1e-30)) ** 0.5, 5),
                                      "gptq": round((after / max(norm, 1e-30)) ** 0.5, 5)}}


def _dequantize(packed: np.ndarray, scales: np.ndarray, zeros: np.ndarray, shape: tuple) -> np.ndarray:
    """MatMulNBits' 4-bit blocks (packed [N, B, block/2], scales [N * B], packed zero points)
    -> the weight they stand for [K, N]."""
    k, n = shape
    blocks, block = packed.shape[1], 2 * packed.shape[2]
    codes = unpack_nibbles(packed, block)  # [N, B, block]
    z = unpack_nibbles(zeros.reshape(n, -1), blocks)  # [N, B]
    return weight_of(codes, scales.reshape(n, blocks), z, shape)[:k]
