"""The recipe's `model:` section -> a torch.nn.Module in eval mode.

Sources: a built-in zoo model, or any `package.module:function` factory. `check()` resolves
the source without building the model, so a factory that does not import fails before any
stage runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.errors import InputError, RecipeError
from pipeline.recipe import ModelSpec, Recipe
from pipeline.zoo import ZOO


def _factory(spec: ModelSpec, where: str) -> Callable[..., Any]:
    target = ZOO[spec.zoo][1] if spec.zoo else spec.factory
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # the user's module may fail in any way while importing
        raise RecipeError(
            f"{where}: model.factory: cannot import `{module_name}` ({type(e).__name__}: {e})",
            "the module must be importable from the current directory or the environment",
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RecipeError(f"{where}: model.factory: `{module_name}` has no function `{attr}`")
    return fn


def _where(recipe: Recipe) -> str:
    return recipe.where


def check(recipe: Recipe) -> None:
    """Fail early, before any work and without importing torch for a zoo model: a factory
    imports, and the weights file exists and is a readable safetensors file."""
    if recipe.model.factory:
        _factory(recipe.model, _where(recipe))  # zoo builders are ours and known to import
    weights = recipe.model.weights
    if weights is not None:
        path = Path(weights)
        if not path.is_file():
            what = "is a folder, not a file" if path.is_dir() else "no such file"
            raise InputError(f"{_where(recipe)}: model.weights: {weights}: {what}")
        _weights_header(path, _where(recipe))


def load(recipe: Recipe):
    """Build the model (and load its weights), in eval mode, on the CPU."""
    import torch

    fn = _factory(recipe.model, _where(recipe))
    model = fn(**recipe.model.kwargs)
    if not isinstance(model, torch.nn.Module):
        raise RecipeError(
            f"{_where(recipe)}: model.factory returned {type(model).__name__}, not a torch.nn.Module"
        )
    if recipe.model.weights is not None:
        _load_weights(model, Path(recipe.model.weights), _where(recipe))
    return model.eval()


def _weights_header(path: Path, where: str) -> dict[str, tuple]:
    """name -> (dtype, shape) from the safetensors header, reading no tensor data."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            return {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise InputError(f"{where}: model.weights: {path} is not a readable safetensors file "
                         f"({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})",
                         "save it with safetensors.torch.save_file(model.state_dict(), path)") from None


def _kind(t) -> str:
    import torch

    if t.dtype == torch.bool:
        return "bool"
    return "float" if t.is_floating_point() else "complex" if t.is_complex() else "integer"


def _load_weights(model, path: Path, where: str) -> None:
    # safetensors holds plain tensors: no pickle, nothing executed while loading.
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise InputError(f"{where}: model.weights: {path} is not a readable safetensors file ({e})") from None
    expected = model.state_dict()
    # Checked here, not left to load_state_dict: it raises a bare RuntimeError on a shape and
    # silently casts integer tensors into float parameters. Shapes first: a checkpoint of
    # another model size is best explained by its first tensor that does not fit.
    for name, want in expected.items():
        got = state.get(name)
        if got is None:
            continue
        if tuple(got.shape) != tuple(want.shape):
            raise InputError(f"{where}: model.weights: {path}: `{name}` has shape {list(got.shape)}, "
                             f"the model's is {list(want.shape)}")
        if _kind(got) != _kind(want):
            raise InputError(f"{where}: model.weights: {path}: `{name}` is {got.dtype}, the model's "
                             f"is {want.dtype} ({_kind(want)} values needed)")
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise InputError(
            f"{where}: model.weights: {path} does not fit the model "
            f"(missing: {', '.join(missing[:3]) or 'none'}; unexpected: {', '.join(unexpected[:3]) or 'none'})"
        )
    model.load_state_dict(state, strict=True)
