"""Workloads, by the recipe's `workload.kind`: the registry (the contract: base.py).

    forward     one forward pass at the inputs' shapes: workloads/tensor.py; compared by
                compare/tensor.py
    generation  prefill + token-by-token decode with a KV cache: workloads/generation.py
                over pipeline/generation/; compared by compare/generation.py

`of(recipe)` and `comparer(recipe)` are the one place a recipe's workload kind is looked
up. Modules are imported on first use. The comparers are named without the package prefix
on purpose: code_digest follows "pipeline.x" strings into stage cache keys, and how
recipes are compared (a command) is no stage's code.
"""

from __future__ import annotations

import importlib

from pipeline.core.errors import DependencyError
from pipeline.workloads.base import COMPARER_NEEDS, Compared, Comparer, Measured, Workload, check

__all__ = ["Compared", "Comparer", "Measured", "Workload", "get", "of", "comparer", "kinds"]

BUILTIN = {
    "forward": "pipeline.workloads.tensor",
    "generation": "pipeline.workloads.generation",
}
COMPARERS = {  # module names below `pipeline.` (see above)
    "forward": "compare.tensor",
    "generation": "compare.generation",
}


def kinds() -> list[str]:
    return list(BUILTIN)


def get(kind: str) -> Workload:
    """The workload of `kind`; one error naming the known kinds when there is none."""
    if kind not in BUILTIN:
        raise DependencyError(f"no workload `{kind}` (known: {', '.join(BUILTIN)})")
    return check(kind, importlib.import_module(BUILTIN[kind]))


def of(recipe) -> Workload:
    """The recipe's workload (its `workload.kind`)."""
    return get(recipe.workload.kind)


def comparer(recipe) -> Comparer:
    """How recipes of this one's workload are compared (`pipeline compare`)."""
    kind = recipe.workload.kind
    get(kind)  # the same error for an unknown kind
    return check(kind, importlib.import_module(f"pipeline.{COMPARERS[kind]}"), COMPARER_NEEDS)
