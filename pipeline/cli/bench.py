"""`pipeline bench RECIPE [--vs OTHER]`: a recipe's engines timed against PyTorch (and another
recipe), verdicts with 95% CIs (the work is commands/bench.py's)."""

from __future__ import annotations

import click

from pipeline.cli.options import recipe_options


@click.command("bench")
@recipe_options
@click.option("--vs", "versus", metavar="RECIPE", default=None,
              help="Also time this recipe's engines and baseline, interleaved, and compare.")
def bench_command(recipe, overrides, force, engines_dir, verbose, only, versus):
    """Benchmark a recipe's engines vs PyTorch (and vs another recipe): verdicts with 95% CIs.

    Builds what is missing first; writes engines/RECIPE/bench.json and a latency PNG.
    """
    from pipeline.commands.bench import bench, tables
    from pipeline.core.errors import RecipeError
    from pipeline.core.ui import Progress, console, out
    from pipeline.store import folder_names as folders

    main = folders.load(recipe, overrides, engines_dir)
    other = folders.load(versus, overrides, engines_dir) if versus else None  # the same --set for both
    if other is not None and other.name == main.name:
        raise RecipeError(f"bench --vs {versus}: `{main.name}` against itself times one "
                          "recipe twice", "name another recipe, e.g. --vs flash")
    result, path = bench(main, other, engines_dir, force, Progress(verbose), verbose, only)
    for t in tables(result):
        out.print(t)
    console.print(f"bench: {path}")
