"""`pipeline tune RECIPE`: the fastest INT8 settings within an accuracy budget, A/B timed (the
search is commands/tune.py's); writes the chosen recipe beside RECIPE."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.options import debug_option, engines_dir_option


@click.command("tune")
@click.argument("recipe")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Override a recipe value (repeatable).")
@click.option("--feeds", "feeds_ref", metavar="MODULE:FUNCTION", default=None,
              help="Held-out feeds the budget is measured on (default: the recipe's validation split).")
@click.option("--worst-cosine", type=float, default=0.99, show_default=True,
              help="Least cosine of any output row (a sentence embedding, a token's logits) vs PyTorch.")
@click.option("--mean-cosine", type=float, default=0.998, show_default=True,
              help="Least mean row cosine vs PyTorch.")
@click.option("--max-task-loss", default=None, metavar="LOSS|PCT%", help="Most the task metric (validate.task) "
              "may lose vs PyTorch on the held-out data, e.g. 0.02 or 2% (default: the recipe's expect.max_task_loss).")
@click.option("--scheme", "schemes", multiple=True, type=click.Choice(["dynamic", "static"]),
              help="Schemes searched (default both).")
@click.option("--alpha", "alphas", multiple=True, type=click.FloatRange(0, 1),
              help="SmoothQuant alphas searched besides none (default 0.5).")
@click.option("--no-exclusions", is_flag=True, help="Do not try keeping sensitive nodes in float.")
@click.option("--within-only", is_flag=True, help="Time only candidates within the budget.")
@click.option("--rank-by-prediction", is_flag=True, help="Build the candidates in order of their predicted "
              "gain (roofline floors on this machine's `pipeline hw` entry); the predictions and how they "
              "ranked against the measured gains are in the result either way.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where the chosen recipe goes (default: RECIPE-tuned.yaml beside RECIPE).")
@engines_dir_option()
@click.option("-v", "--verbose", is_flag=True, help="Show the tools' own output.")
@debug_option
def tune_command(recipe, overrides, feeds_ref, worst_cosine, mean_cosine, max_task_loss, schemes,
                 alphas, no_exclusions, within_only, rank_by_prediction, out, engines_dir, verbose):
    """Search INT8 settings for the fastest engine within an accuracy budget (A/B timed)."""
    from pipeline import recipe as recipe_mod
    from pipeline.commands import tune
    from pipeline.core.ui import console
    from pipeline.core.ui import out as stdout
    from pipeline.metrics.budget import Budget

    loaded = recipe_mod.load(recipe, overrides)
    result, folder, written = tune.command(
        loaded, engines_dir, feeds_ref, Budget(worst_cosine, mean_cosine),
        schemes or ("dynamic", "static"), (None, *(alphas or (0.5,))), not no_exclusions, out, verbose,
        not within_only, _task_loss_value(max_task_loss), rank_by_prediction)
    stdout.print(tune.table(result))
    console.print(f"tune: {folder / 'tune.md'}" + (f"; chosen recipe: {written}" if written else
                                                    "; nothing beat FP32 within the budget"))


def _task_loss_value(text: str | None) -> float | str | None:
    """--max-task-loss as expect.max_task_loss takes it: a number, or a percentage string."""
    if text is None or text.strip().endswith("%"):
        return text
    try:
        return float(text)
    except ValueError:
        raise click.BadParameter(f"`{text}` is neither a number nor a percentage like '2%'",
                                 param_hint="--max-task-loss") from None
