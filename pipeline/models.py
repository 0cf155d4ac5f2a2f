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
    return str(recipe.source) if recipe.source else recipe.name


def check(recipe: Recipe) -> None:
    """Fail early: the factory imports and the weights file exists.

    Zoo models are ours and import torch: they are not imported here, so a fully cached
    rerun never pays for `import torch`.
    """
    if recipe.model.factory is not None:
        _factory(recipe.model, _where(recipe))
    weights = recipe.model.weights
    if weights is not None and not Path(weights).is_file():
        raise InputError(f"{_where(recipe)}: model.weights: no such file {weights}")


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
        _load_weights(model, Path(recipe.model.weights))
    return model.eval()


def _load_weights(model, path: Path) -> None:
    # safetensors holds plain tensors: no pickle, nothing executed while loading.
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise InputError(f"model.weights: {path} is not a readable safetensors file ({e})") from None
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise InputError(
            f"model.weights: {path} does not fit the model "
            f"(missing: {', '.join(missing[:3]) or 'none'}; unexpected: {', '.join(unexpected[:3]) or 'none'})"
        )
