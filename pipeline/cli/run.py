"""`pipeline run RECIPE` and the commands that stop it at a stage: export, optimize, precision
(alias quantize), build, validate, report. Each runs the stages up to its own through
run/execute.py (a stage only when its inputs changed), prints the report table when there is
one, and fails with the gates' exit code."""

from __future__ import annotations

import click

from pipeline.cli.options import recipe_options


def _execute(recipe_ref: str, until: str, overrides, force, engines_dir, verbose, only=()) -> None:
    from pipeline import workloads
    from pipeline.artifacts import dump
    from pipeline.core.ui import Progress, console, out
    from pipeline.render.report_table import table
    from pipeline.run.execute import Run, check_gates
    from pipeline.store import folder_names as folders

    recipe = folders.load(recipe_ref, overrides, engines_dir)
    if recipe.overrides:  # a variant of the recipe: its own folder, the plain one is untouched
        console.print(f"[dim]--set: this run writes into {engines_dir / folders.folder_name(recipe)} "
                      f"(not {engines_dir / recipe.name})[/]")
    outcome = Run(recipe, engines_dir, force=force, progress=Progress(verbose), verbose=verbose,
                  only=only).execute(until)
    if until == "precision" and recipe.precision.mode == "fp32":
        console.print(f"[dim]nothing to quantize: recipe `{recipe.name}` has precision.mode fp32 "
                      "(set precision.mode, e.g. --set precision.mode=fp16, for a precision stage)[/]")
    elif not outcome.work_done:
        console.print("[dim]nothing to do: every stage is up to date[/]")
    if outcome.report is not None:
        out.print(table(dump(outcome.report), workloads.of(recipe)))
        console.print(f"report: {outcome.store.dir / 'report.md'}")
    console.print(f"engines: {outcome.store.dir}", soft_wrap=True)
    if outcome.report is not None:
        check_gates(outcome.report)


def _stage_command(name: str, until: str, summary: str, hidden: bool = False) -> click.Command:
    builds = until not in ("export", "optimize", "precision")  # graph stages build no target

    @click.command(name, help=summary, hidden=hidden)
    @recipe_options(targets=builds)
    def command(recipe, overrides, force, engines_dir, verbose, only):
        _execute(recipe, until, overrides, force, engines_dir, verbose, only)

    return command


COMMANDS = (
    _stage_command("run", "report", "Run every stage: export, optimize, precision, build, baseline, "
                   "validate, report (each one only when its inputs changed)."),
    _stage_command("export", "export", "Export the PyTorch model to ONNX (with a parity check)."),
    _stage_command("optimize", "optimize", "Export, then run the recipe's graph passes, each checked."),
    _stage_command("precision", "precision", "Set the recipe's precision in the graph (FP16 casts, "
                   "INT8/FP8 Q/DQ with calibration, INT4 weights), exporting and optimizing first if "
                   "needed."),
    _stage_command("quantize", "precision", "Alias of `precision` (kept for old scripts).", hidden=True),
    _stage_command("build", "build", "Build the recipe's engines (exporting first if needed)."),
    _stage_command("validate", "validate", "Validate every engine against the PyTorch baseline."),
    _stage_command("report", "report", "Write report.json / report.md (running what it needs)."),
)
