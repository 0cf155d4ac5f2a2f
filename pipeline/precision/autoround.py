"""AutoRound (Cheng et al., 2023): each decoder layer's 4-bit rounding fitted to the layer's output.

GPTQ (gptq.py) fits each linear layer alone to its own inputs' Hessian; on SmolLM2 a lower
layer error did not buy answers (benchmarks/results/float-int4-2026-12-07.md). AutoRound fits
what the next layer reads: a whole decoder layer's output. Per linear layer and block of
`block` input channels (the MatMulNBits grid: asymmetric, codes 0..15, an integer zero point):

    high = max(w, 0) * a    low = min(w, 0) * b          a, b in [0.5, 1], per block
    scale = (high - low) / 15    zero = round(-low / scale)
    q = clip(round(w / scale + v) + zero, 0, 15)        v in [-0.5, 0.5], per weight
    w' = (q - zero) * scale

At a = b = 1, v = 0 this is min/max round-to-nearest (gptq.round_to_nearest). v, a and b are
fitted by signed gradient descent (the paper's SignSGD: the step is the gradient's sign, the
rate falls linearly to 0, so v moves at most `lr * iters / 2` in all) through rounding's
straight-through gradient, minimizing the mean squared error between

    the float layer on the float model's inputs                  (what the model should see)
    the rounded layer on the inputs the rounded layers below give (what it will see)

so a layer also makes up for what the layers below it lost. The layers are fitted in order,
each on `spec.sequences` calibration sequences a step. Only the decoder layers' linear layers
are fitted (the paper's scope); the rest of the graph's 4-bit nodes keep ONNX Runtime's
asymmetric round-to-nearest. The fitted blocks replace those the quantizer wrote, in the
float graph's MatMulNBits nodes, found by their weights' values (a packed q|k|v node holds
three linear layers' columns).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.core.errors import RecipeError
from pipeline.precision.gptq import LEVELS
from pipeline.precision.integer_zero import asymmetric_nodes, set_blocks

Blocks = tuple[np.ndarray, np.ndarray, np.ndarray]  # codes [N, B, block] u8, scales [N, B] f32, zeros [N, B] u8


def _round(x: torch.Tensor) -> torch.Tensor:
    """round(x) forward, identity backward (the straight-through estimator)."""
    return (x.round() - x).detach() + x


class Rounding:
    """One linear layer's learnable rounding: weight [out, K] in blocks of `block` along K."""

    def __init__(self, weight: torch.Tensor, block: int):
        out, k = weight.shape
        if k % block:
            raise ValueError(f"AutoRound needs K ({k}) to be a multiple of the block ({block})")
        self.shape = weight.shape
        self.groups = weight.detach().float().reshape(out, k // block, block)  # [out, B, block]
        self.low = self.groups.amin(-1).clamp(max=0)   # [out, B]: 0 is always on the grid
        self.high = self.groups.amax(-1).clamp(min=0)
        self.offset = torch.zeros_like(self.groups, requires_grad=True)  # v
        self.shrink_high = torch.ones_like(self.high, requires_grad=True)  # a
        self.shrink_low = torch.ones_like(self.low, requires_grad=True)    # b

    @property
    def params(self) -> list[torch.Tensor]:
        return [self.offset, self.shrink_high, self.shrink_low]

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """codes [out, B, block], scales [out, B], zero points [out, B] (float, differentiable)."""
        high, low = self.high * self.shrink_high, self.low * self.shrink_low
        scale = torch.where(high > low, (high - low) / LEVELS, torch.ones_like(high))
        zero = torch.clamp(_round(-low / scale), 0, LEVELS)
        codes = torch.clamp(_round(self.groups / scale[..., None] + self.offset) + zero[..., None], 0, LEVELS)
        return codes, scale, zero

    def weight(self) -> torch.Tensor:
        codes, scale, zero = self.blocks()
        return ((codes - zero[..., None]) * scale[..., None]).reshape(self.shape)

    @torch.no_grad()
    def step(self, lr: float) -> None:
        """One signed-gradient step, each parameter kept in its range."""
        for p, (lo, hi) in zip(self.params, ((-0.5, 0.5), (0.5, 1.0), (0.5, 1.0))):
            p -= lr * p.grad.sign()
            p.clamp_(lo, hi)
            p.grad = None

    @torch.no_grad()
    def numpy_blocks(self) -> Blocks:
        codes, scale, zero = self.blocks()
        return codes.to(torch.uint8).numpy(), scale.float().numpy(), zero.to(torch.uint8).numpy()


@dataclass(frozen=True)
class Fitted:
    """One linear layer's fitted blocks and the float weight [out, K] they stand for (by which
    its columns are found in the graph)."""

    codes: np.ndarray   # [out, B, block] uint8
    scales: np.ndarray  # [out, B] float32
    zeros: np.ndarray   # [out, B] uint8
    weight: np.ndarray  # [out, K] float32


@dataclass(frozen=True)
class LayerFit:
    """One decoder layer's output error (mean squared, over every calibration sequence) with
    round-to-nearest and after fitting, both on the inputs the rounded layers below give."""

    layer: int
    rtn: float
    fitted: float


class _Stop(Exception):
    """Raised by the hook that takes the first decoder layer's inputs: nothing above is run."""


def decoder_layers(model):
    """(the transformers causal LM, its decoder layers) of `model` or of the project's wrapper
    of one (pipeline/model/hf.py keeps it as `.model`)."""
    hf = model if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(hf.get_decoder(), "layers", None) if hasattr(hf, "get_decoder") else None
    if layers is None:
        raise RecipeError(f"int4_method autoround fits the decoder layers of a transformers causal LM; "
                          f"{type(model).__name__} has none (get_decoder().layers)",
                          "use int4_method gptq, which needs only the ONNX graph")
    return hf, list(layers)


def layer_inputs(hf, layer, sequences: list[torch.Tensor]) -> list[tuple[torch.Tensor, dict]]:
    """(hidden states [1, T, hidden], the layer's other arguments) per sequence [1, T]."""
    seen = []

    def hook(module, args, kwargs):
        seen.append((args[0], {k: v for k, v in kwargs.items() if k not in ("past_key_values", "cache")}))
        raise _Stop

    handle = layer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            for ids in sequences:
                try:
                    hf(input_ids=ids, use_cache=False)
                except _Stop:
                    pass
    finally:
        handle.remove()
    return seen


def pieces(sequences: list[torch.Tensor], max_tokens: int) -> list[torch.Tensor]:
    """Each sequence [1, T] cut into pieces of at most `max_tokens` [1, <= max_tokens], in order."""
    return [ids[:, start:start + max_tokens] for ids in sequences for start in range(0, ids.shape[-1], max_tokens)]


def run_layer(layer, x: torch.Tensor, kwargs: dict, weights: dict | None = None) -> torch.Tensor:
    """The layer's output hidden states [1, T, hidden], its weights overridden by `weights`
    (parameter name -> tensor)."""
    out = torch.func.functional_call(layer, weights or {}, (x,), kwargs)
    return out[0] if isinstance(out, tuple) else out


def _weights(rounding: dict[str, Rounding]) -> dict[str, torch.Tensor]:
    return {f"{name}.weight": r.weight() for name, r in rounding.items()}


@torch.no_grad()
def _error(layer, rounding, inputs, kwargs, targets) -> float:
    """Mean squared error of the rounded layer's outputs over every sequence."""
    w = _weights(rounding)
    total = sum(F.mse_loss(run_layer(layer, x, kw, w), t, reduction="sum").item()
                for x, kw, t in zip(inputs, kwargs, targets))
    return total / sum(t.numel() for t in targets)


def fit(model, sequences: list[torch.Tensor], block: int, spec, note=None) -> tuple[dict[str, Fitted], list[LayerFit]]:
    """Fits every decoder layer's linear layers, in order, on `sequences` (token ids [1, T]
    each). Returns each linear layer's blocks by its name under the decoder layers (e.g.
    "3.mlp.down_proj") and each decoder layer's fit; `note(line)` hears of every layer."""
    hf, layers = decoder_layers(model)
    order = torch.Generator().manual_seed(spec.seed)
    inputs = layer_inputs(hf, layers[0], sequences)
    kwargs = [kw for _, kw in inputs]
    clean = [x for x, _ in inputs]  # the float model's inputs to this layer
    rounded = list(clean)           # the inputs the rounded layers below give
    lr = spec.lr if spec.lr is not None else 1.0 / spec.iters
    fitted: dict[str, Fitted] = {}
    fits = []
    for index, layer in enumerate(layers):
        with torch.no_grad():
            targets = [run_layer(layer, x, kw) for x, kw in zip(clean, kwargs)]
        linears = {name: m for name, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
        rounding = {name: Rounding(m.weight, block) for name, m in linears.items()}
        before = _error(layer, rounding, rounded, kwargs, targets)
        for step in range(spec.iters):
            pick = torch.randperm(len(rounded), generator=order)[:spec.sequences].tolist()
            w = _weights(rounding)
            loss = sum(F.mse_loss(run_layer(layer, rounded[j], kwargs[j], w), targets[j]) for j in pick) / len(pick)
            loss.backward()
            for r in rounding.values():
                r.step(lr * (1 - step / spec.iters))
        fits.append(LayerFit(index, before, _error(layer, rounding, rounded, kwargs, targets)))
        if note is not None:
            note(f"autoround: layer {index + 1}/{len(layers)}, output error {before:.3g} -> {fits[-1].fitted:.3g}")
        with torch.no_grad():
            w = _weights(rounding)
            rounded = [run_layer(layer, x, kw, w) for x, kw in zip(rounded, kwargs)]
        clean = targets
        for name, r in rounding.items():
            fitted[f"{index}.{name}"] = Fitted(*r.numpy_blocks(), linears[name].weight.detach().float().numpy())
    return fitted, fits


def onnx_blocks(originals: dict[str, np.ndarray], fitted: dict[str, Fitted]) -> tuple[dict[str, Blocks], list[str]]:
    """The fitted blocks of each float weight of the graph (initializer name -> [K, N]) whose
    columns are fitted linear layers' rows (one layer, or several packed side by side), found
    by value; and the weights no fitted layer makes up (they keep round-to-nearest)."""
    by_row = {f.weight[0].tobytes(): f for f in fitted.values()}  # a layer's first row: a column of the graph's
    found, missing = {}, []
    for name, w in originals.items():
        parts, column = [], 0
        while column < w.shape[1]:
            part = by_row.get(np.ascontiguousarray(w[:, column], np.float32).tobytes())
            if part is None or not np.array_equal(part.weight.T, w[:, column:column + part.weight.shape[0]]):
                break
            parts.append(part)
            column += part.weight.shape[0]
        if parts and column == w.shape[1]:
            found[name] = tuple(np.concatenate([getattr(p, field) for p in parts])
                                for field in ("codes", "scales", "zeros"))
        else:
            missing.append(name)
    return found, missing


def apply(model, blocks: dict[str, Blocks], accuracy_level: int = 4) -> int:
    """Every 4-bit MatMulNBits with uint8 zero points (ONNX Runtime's asymmetric RTN) whose
    float weight has fitted blocks takes them, in place; returns how many did."""
    inits = {i.name: i for i in model.graph.initializer}
    done = 0
    for node, source, _ in asymmetric_nodes(model):
        if source in blocks:
            set_blocks(node, inits, *blocks[source], accuracy_level)
            done += 1
    return done
