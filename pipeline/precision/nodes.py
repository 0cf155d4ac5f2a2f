"""Which nodes of a graph a precision mode touches, and the recipe's exclusions.

A node is quantizable when its op type is in `precision.op_types`; for weight-only INT4
it must also take a constant weight (an initializer) as its second input. Exclusions are
exact node names or regexes (full match); a pattern that matches no quantizable node is
a user error, caught before any work.
"""

from __future__ import annotations

import re

from pipeline.core.errors import RecipeError


def quantizable(model, op_types: list[str], weight_only: bool = False) -> list[str]:
    """Names of the nodes a quantizer may touch, in graph order."""
    initializers = {i.name for i in model.graph.initializer}
    out = []
    for node in model.graph.node:
        if node.op_type not in op_types:
            continue
        if weight_only and (len(node.input) < 2 or node.input[1] not in initializers):
            continue
        out.append(node.name)
    return out


# A GEMM with fewer input or output channels than this gains nothing from integer kernels
# (it is mostly overhead) and takes all of the rounding. (NVIDIA's ModelOpt, for the same
# reason, leaves GEMV-shaped MatMuls, a dimension of 1, unquantized.)
MIN_CHANNELS = 16


def too_small(model, names: list[str]) -> list[str]:
    """Of `names`, the MatMul/Gemm nodes whose constant operand has a dimension < MIN_CHANNELS.

    Example: a rotary-embedding fusion computes its angle table as positions [P, 1] @
    inv_freq [1, d/2]; quantized, the angles (up to P radians) lose ~1% and the logits move
    (flash-int8: cosine 0.9998 -> 0.9957).
    """
    shapes = {i.name: tuple(i.dims) for i in model.graph.initializer}
    wanted = set(names)
    out = []
    for node in model.graph.node:
        if node.name not in wanted or node.op_type not in ("MatMul", "Gemm"):
            continue
        weights = [shapes[i] for i in node.input[:2] if i in shapes]
        if weights and min(weights[0][-2:]) < MIN_CHANNELS:
            out.append(node.name)
    return out


def excluded(names: list[str], patterns: list[str], where: str = "precision.exclude") -> list[str]:
    """Nodes matched by `patterns`; RecipeError naming a pattern that matches none."""
    hits: list[str] = []
    for pattern in patterns:
        regex = re.compile(pattern)
        matched = [n for n in names if n == pattern or regex.fullmatch(n)]
        if not matched:
            examples = ", ".join(names[:6]) + (", …" if len(names) > 6 else "")
            raise RecipeError(
                f"{where}: `{pattern}` matches no quantizable node",
                f"node names look like: {examples or 'none (nothing to quantize)'}",
            )
        hits += [n for n in matched if n not in hits]
    return hits
