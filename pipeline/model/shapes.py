"""The recipe's dynamic dims in the forms the exporters take: torch.export Dims and the
TorchScript exporter's dynamic_axes. Shared by the export stage and the AOTInductor
backend (a backend imports no stage)."""

from __future__ import annotations

from pipeline.recipe import Dim, Recipe

DimSymbols = dict[tuple[str, int], tuple[str, Dim]]  # (input, axis) -> (symbol, its Dim)
DynamicAxes = dict[str, dict[int, str]]  # input -> {axis: symbol}: torch.onnx's dynamic_axes


def dim_symbols(recipe: Recipe) -> DimSymbols:
    """(input, axis) -> (symbol, Dim) for every dynamic axis; shared names share symbols."""
    out = {}
    for spec in recipe.inputs:
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, Dim):
                out[(spec.name, axis)] = (dim.name or f"{spec.name}_{axis}", dim)
    return out


def dynamic_shapes(recipe: Recipe):
    """torch.export Dims, one object per symbol (positional, in forward() order)."""
    import torch

    dims: dict[str, torch.export.Dim] = {}
    per_input = []
    symbols = dim_symbols(recipe)
    for spec in recipe.inputs:
        axes = {}
        for axis in range(len(spec.shape)):
            if (spec.name, axis) in symbols:
                symbol, dim = symbols[(spec.name, axis)]
                if symbol not in dims:
                    dims[symbol] = torch.export.Dim(symbol, min=dim.min, max=dim.max)
                axes[axis] = dims[symbol]
        per_input.append(axes or None)
    return tuple(per_input)


def dynamic_axes(recipe: Recipe) -> DynamicAxes:
    """TorchScript exporter's form: input -> {axis: symbol}."""
    axes: dict[str, dict[int, str]] = {}
    for (name, axis), (symbol, _) in dim_symbols(recipe).items():
        axes.setdefault(name, {})[axis] = symbol
    return axes
