"""What the timing protocol (pipeline/bench) times, opened here: engines through their
backend, the PyTorch baseline, and the timing feed. The protocol itself imports no backend
and no stage; it takes these openers (callables returning an unentered Runner)."""

from __future__ import annotations

from pathlib import Path

from pipeline import backends, data
from pipeline.model import sources as models
from pipeline.recipe import Recipe


def engine_opener(recipe: Recipe, target, path: Path):
    spec = recipe.validate_.latency
    return lambda: backends.get(target.kind).open(path, target, recipe, threads=recipe.validate_.threads,
                                                  spin=spec.spin)


def baseline_opener(recipe: Recipe):
    return lambda: baseline_runner(recipe, models.load(recipe), baseline_device(recipe))


def baseline_runner(recipe: Recipe, model, device: str = "cpu", cls=None, dtype: str = "fp32"):
    """The eager PyTorch model as a Runner (`cls`: TorchRunner, or CudaGraphRunner on GPU)."""
    if cls is None:
        from pipeline.backends.torch import TorchRunner as cls
    return cls(model, [i.name for i in recipe.inputs], recipe.outputs,
               threads=recipe.validate_.threads, device=device, dtype=dtype)


def baseline_device(recipe: Recipe) -> str:
    """Where the PyTorch baseline runs: validate.device, `auto` resolved on this machine."""
    from pipeline.core import deps

    choice = recipe.validate_.device
    return ("cuda" if deps.gpus() else "cpu") if choice == "auto" else choice


def timing_feed(recipe: Recipe) -> data.Feed:
    """The feed every runner is timed on: the profile's opt point."""
    return data.feeds(recipe, "export")[0]
