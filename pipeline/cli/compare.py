"""`pipeline compare RECIPES...`: recipes side by side, the first the reference (the work is
commands/compare_recipes.py's); with --load, their recorded `pipeline load` results
(loadgen/load_compare.py's)."""

from __future__ import annotations

import click

from pipeline.cli.options import debug_option, engines_dir_option


@click.command("compare")
@click.argument("recipes", nargs=-1, required=True)
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Override a value in every recipe (repeatable).")
@click.option("--force", is_flag=True, help="Rebuild every recipe's stages.")
@engines_dir_option("Where the recipes' engines/<recipe>/ folders go (env PIPELINE_ENGINES).")
@click.option("-v", "--verbose", is_flag=True, help="Show the tools' own output.")
@click.option("--load", is_flag=True, help="Compare `pipeline load` results: capacities, p99 at equal rates.")
@debug_option
def compare_command(recipes, overrides, force, engines_dir, verbose, load):
    """Compare recipes side by side: verdicts with 95% CIs, where the time went (category
    deltas and likely causes), where the error came from. The first recipe is the reference."""
    if load:  # no builds, the recorded load results only
        from pipeline.loadgen import load_compare

        return load_compare.show(recipes, overrides, engines_dir)
    from pipeline.commands.compare_recipes import compare
    from pipeline.core.ui import Progress, console, out
    from pipeline.store import folder_names as folders

    loaded = [folders.load(r, overrides, engines_dir) for r in recipes]
    compared = compare(loaded, engines_dir, force, Progress(verbose), verbose)
    for part in compared.printed:
        out.print(part)
    console.print("compare: " + ", ".join(str(f) for f in compared.files))
