"""The `pipeline` command: one subcommand per stage, each loads a recipe and calls run.py.

Imports here stay light (click, rich, pydantic): torch and onnxruntime are imported by the
stages only when there is work to do, so `pipeline --help` is instant.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import click

from pipeline import __version__
from pipeline.errors import PipelineError

_debug = False


def _set_debug(ctx, param, value):
    global _debug
    _debug = _debug or bool(value)
    return value


def recipe_options(fn):
    """Options shared by every command that runs a recipe."""

    @click.argument("recipe")
    @click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
                  help="Override a recipe value, e.g. --set validate.threads=2 (repeatable).")
    @click.option("--force", is_flag=True, help="Redo every stage even when its inputs are unchanged.")
    @click.option("--engines-dir", type=click.Path(file_okay=False, path_type=Path),
                  default=lambda: os.environ.get("PIPELINE_ENGINES", "engines"), show_default="engines",
                  help="Where engines/<recipe>/ folders go (env PIPELINE_ENGINES).")
    @click.option("-v", "--verbose", is_flag=True, help="Show the tools' own output.")
    @click.option("--debug", is_flag=True, expose_value=False, callback=_set_debug, is_eager=True,
                  help="Show the traceback of errors.")
    @functools.wraps(fn)
    def wrapper(**kwargs):
        return fn(**kwargs)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pipeline")
@click.option("--debug", is_flag=True, expose_value=False, callback=_set_debug, is_eager=True,
              help="Show the traceback of errors.")
def cli():
    """Turn PyTorch model variants into engines and prove what each engine is worth.

    RECIPE is a name under recipes/ (e.g. `standard`) or a path to a YAML file.
    """


def _execute(recipe_ref: str, until: str, overrides, force, engines_dir, verbose) -> None:
    from pipeline import recipe as recipe_mod
    from pipeline.run import Run, check_gates
    from pipeline.stages.report import table
    from pipeline.ui import Progress, console, out

    recipe = recipe_mod.load(recipe_ref, overrides)
    outcome = Run(recipe, engines_dir, force=force, progress=Progress(verbose), verbose=verbose).execute(until)
    if not outcome.work_done:
        console.print("[dim]nothing to do: every stage is up to date[/]")
    if outcome.report is not None:
        out.print(table(outcome.report))
        console.print(f"report: {outcome.store.dir / 'report.md'}")
        check_gates(outcome.report)
    else:
        console.print(f"artifacts: {outcome.store.dir}")


def _stage_command(name: str, until: str, summary: str):
    @cli.command(name, help=summary)
    @recipe_options
    def command(recipe, overrides, force, engines_dir, verbose):
        _execute(recipe, until, overrides, force, engines_dir, verbose)

    return command


_stage_command("run", "report", "Run every stage: export, build, validate, report.")
_stage_command("export", "export", "Export the PyTorch model to ONNX (with a parity check).")
_stage_command("build", "build", "Build the recipe's engines (exporting first if needed).")
_stage_command("validate", "validate", "Validate every engine against the PyTorch baseline.")
_stage_command("report", "report", "Write report.json / report.md (running what it needs).")


@cli.command("recipes")
@click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Recipe folder (default: ./recipes).")
def recipes_command(folder):
    """List the recipes and what each one is."""
    from rich.table import Table

    from pipeline import recipe as recipe_mod
    from pipeline.ui import out

    t = Table(title="recipes")
    for col in ("name", "description", "model", "targets"):
        t.add_column(col)
    for path in recipe_mod.list_recipes(folder):
        try:
            r = recipe_mod.load(path)
            model = r.model.zoo or r.model.factory
            kw = ", ".join(f"{k}={v}" for k, v in r.model.kwargs.items() if k in ("size", "attention", "ffn_prune"))
            t.add_row(r.name, r.description, f"{model} ({kw})" if kw else model,
                      ", ".join(x.id for x in r.targets))
        except PipelineError as e:
            t.add_row(path.stem, f"[red]invalid: {e}[/]", "", "")
    out.print(t)


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one `Error:` line and their exit code."""
    try:
        cli.main(args=argv, prog_name="pipeline", standalone_mode=False)
    except PipelineError as e:
        if _debug:
            raise
        click.echo(f"Error: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except OSError as e:  # the machine's to fix (disk full, read-only, permissions): no trace
        if _debug:
            raise
        click.echo(f"Error: {e} (rerun with --debug for the trace)".replace("\n", " "), err=True)
        sys.exit(4)
    except KeyboardInterrupt:
        click.echo("Interrupted; finished artifacts are kept, a rerun resumes.", err=True)
        sys.exit(130)
    sys.exit(0)


if __name__ == "__main__":
    main()
