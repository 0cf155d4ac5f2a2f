"""Activation-aware channel scaling (AWQ) for 4-bit round-to-nearest, searched on calibration text.

Round-to-nearest INT4 (`precision.int4_method: rtn`: symmetric blocks of 32 along the input,
ONNX Runtime's quantizer) gives every input channel of a block the same step. A channel that
carries large activations loses the most to that step. AWQ (Lin et al., 2023) scales such
channels up in the weight and down in the activation before quantizing:

    y = W x = (W diag(s)) (diag(s)^-1 x)     s_j = mean|x_j| ** alpha, alpha searched per group

The scale folds into the op that makes x (an RMSNorm's gain, up_proj's rows), so the float model
computes the same function and only the quantizer sees it differently. The search is AWQ's:
for each group of linear layers reading the same x, each alpha in ALPHAS is tried by
fake-quantizing the scaled weights exactly as the rtn route will (symmetric, 4 bits, blocks of
32, the block's largest magnitude on -8) and the alpha whose outputs move least on the
calibration activations is kept. Groups, per decoder layer:

    input_layernorm            -> q_proj, k_proj, v_proj
    post_attention_layernorm   -> gate_proj, up_proj
    up_proj (rows)             -> down_proj          (silu(gate) * up is linear in up)

o_proj is left alone, as AutoAWQ leaves it under grouped-query attention (its input channels
come from v_proj heads shared by several query heads). Calibration: the sentences (~250
tokens of everyday English, neither the held-out text nor the chat questions: calibration.py).
"""

from __future__ import annotations

from pipeline.core.errors import RecipeError
from pipeline.model.calibration import inputs_of
from pipeline.model.rescale import fold

BLOCK = 32
ALPHAS = tuple(i / 20 for i in range(21))  # AutoAWQ's grid: 0, 0.05, ..., 1
METHOD = "awq-rtn4-b32-v1"  # in the converted folder's name: a change converts again


def fake_quantize(weight, block: int = BLOCK):
    """weight [out, in] through symmetric 4-bit round-to-nearest in blocks of `block` inputs, as
    ONNX Runtime's blockwise quantizer writes it: the block's value of largest magnitude maps to
    -8 (scale = -that / 8), the others round to the nearest step in [-8, 7]."""
    import torch

    out, k = weight.shape
    blocks = weight.reshape(out, k // block, block)
    extreme = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))  # [out, nb, 1], signed
    scale = torch.where(extreme == 0, torch.ones_like(extreme), -extreme / 8)
    return (torch.clamp(torch.round(blocks / scale), -8, 7) * scale).reshape(out, k)


def _best_scale(linears, x):
    """The channel scales s [in] (alpha searched) for the linears reading x [tokens, in]."""
    import torch

    mean_abs = x.abs().mean(0).clamp(min=1e-8)
    reference = [x @ linear.weight.T for linear in linears]
    best, best_error = torch.ones_like(mean_abs), None
    for alpha in ALPHAS:
        s = mean_abs ** alpha
        s = s / (s.max() * s.min()).sqrt()  # centred on 1 in log scale, as AutoAWQ does
        error = sum(((x / s) @ fake_quantize(linear.weight * s).T - ref).pow(2).mean()
                    for linear, ref in zip(linears, reference, strict=True))
        if best_error is None or error < best_error:
            best, best_error = s, error
    return best


def awq_scale(model, ids) -> int:
    """Search and fold AWQ scales into a Llama-family causal LM in place, from calibration ids
    [1, T]; returns the number of groups scaled."""
    import torch

    if any(k % BLOCK for layer in model.model.layers
           for k in (layer.mlp.down_proj.weight.shape[1], layer.self_attn.q_proj.weight.shape[1])):
        raise RecipeError(f"model.transformers.awq: every linear layer's input size must be a multiple of {BLOCK}")
    inputs = inputs_of(model, ids, {  # (layer, linear) -> its input [T, in]
        (i, name): getattr(layer.self_attn if name == "q_proj" else layer.mlp, name)
        for i, layer in enumerate(model.model.layers) for name in ("q_proj", "gate_proj", "down_proj")})
    groups = 0
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            for maker, linears, x in (
                    (layer.input_layernorm, (attn.q_proj, attn.k_proj, attn.v_proj), inputs[i, "q_proj"]),
                    (layer.post_attention_layernorm, (mlp.gate_proj, mlp.up_proj), inputs[i, "gate_proj"]),
                    (mlp.up_proj, (mlp.down_proj,), inputs[i, "down_proj"])):
                fold(maker, linears, _best_scale(linears, x.float()))
                groups += 1
    return groups
