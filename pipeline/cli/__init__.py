"""The `pipeline` command: one subcommand per stage, each loads a recipe and calls run.py.

Imports here stay light (click, rich, pydantic): torch and onnxruntime are imported by the
stages only when there is work to do, so `pipeline --help` is instant.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from pipeline import __version__
from pipeline.cli.fleet import fleet
from pipeline.cli.options import DEBUG, debug_option, engines_dir_option
from pipeline.cli.serve import serve_command
from pipeline.cli.sign import keygen_command, sign_command, verify_command
from pipeline.commands.generate import generate_command
from pipeline.core.errors import PipelineError
from pipeline.core.errors import RecipeError as PipelineRecipeError
from pipeline.core.text import printable


def recipe_options(fn=None, *, targets: bool = True):
    """Options shared by every command that runs a recipe. `targets`: the command builds
    engines, so --target (build only these targets) means something for it."""
    if fn is None:
        return functools.partial(recipe_options, targets=targets)

    @click.argument("recipe")
    @click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
                  help="Override a recipe value, e.g. --set validate.threads=2 (repeatable).")
    @click.option("--force", is_flag=True, help="Redo every stage even when its inputs are unchanged "
                  "(an unreadable manifest.json is kept aside under another name).")
    @engines_dir_option("Where engines/<recipe>/ folders go (env PIPELINE_ENGINES).")
    @click.option("-v", "--verbose", is_flag=True, help="Show the tools' own output.")
    @click.option("--target", "only", multiple=True, metavar="ID|KIND", hidden=not targets,
                  help="Build only this target (id or kind, repeatable); default: all. The report "
                  "keeps the other targets' entries from the last run of the same recipe.")
    @debug_option
    @functools.wraps(fn)
    def wrapper(**kwargs):
        return fn(**kwargs)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pipeline")
@debug_option
def cli():
    """Turn PyTorch model variants into engines and prove what each engine is worth.

    RECIPE is a name under recipes/ (e.g. `standard`) or a path to a YAML file. A run with
    --set values writes into engines/RECIPE@<8 hex digits>/ (printed as `engines: ...`), never
    into engines/RECIPE/; that folder name also works as RECIPE (it brings its --set values).
    """
    from pipeline import backends

    backends.load_plugins()  # third-party target kinds, before any recipe is read


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


def _stage_command(name: str, until: str, summary: str, hidden: bool = False):
    builds = until not in ("export", "optimize", "precision")  # graph stages build no target

    @cli.command(name, help=summary, hidden=hidden)
    @recipe_options(targets=builds)
    def command(recipe, overrides, force, engines_dir, verbose, only):
        _execute(recipe, until, overrides, force, engines_dir, verbose, only)

    return command


_stage_command("run", "report", "Run every stage: export, optimize, precision, build, baseline, "
               "validate, report (each one only when its inputs changed).")
_stage_command("export", "export", "Export the PyTorch model to ONNX (with a parity check).")
_stage_command("optimize", "optimize", "Export, then run the recipe's graph passes, each checked.")
_stage_command("precision", "precision", "Set the recipe's precision in the graph (FP16 casts, INT8/FP8 "
               "Q/DQ with calibration, INT4 weights), exporting and optimizing first if needed.")
_stage_command("quantize", "precision", "Alias of `precision` (kept for old scripts).", hidden=True)
_stage_command("build", "build", "Build the recipe's engines (exporting first if needed).")
_stage_command("validate", "validate", "Validate every engine against the PyTorch baseline.")
_stage_command("report", "report", "Write report.json / report.md (running what it needs).")


for _command in (verify_command, sign_command, keygen_command):  # pipeline/commands/sign.py
    cli.add_command(debug_option(_command))


@cli.command("deploy")
@click.argument("recipe")
@click.option("--triton", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Triton model repository to write <recipe>-<target>/ model folders into.")
@click.option("--target", "targets", multiple=True, metavar="ID|KIND",
              help="Deploy only this target (repeatable); default: every deployable engine.")
@click.option("--version", "model_version", type=click.IntRange(1, 2**63 - 1), default=1, show_default=True,
              help="Model version folder.")
@click.option("--instances", type=click.IntRange(1, 2**31 - 1), default=1, show_default=True,
              help="Instances per device (instance_group count).")
@click.option("--allow-failed-gates", is_flag=True, help="Deploy engines that failed a gate.")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="The --set values the engines were built with.")
@engines_dir_option("Where the recipe's engines/<recipe>/ folder is (env PIPELINE_ENGINES).")
@debug_option
def deploy_command(recipe, out, targets, model_version, instances, allow_failed_gates, overrides,
                   engines_dir):
    """Write a recipe's validated engines into a Triton Inference Server model repository."""
    from pipeline.commands import deploy
    from pipeline.core.text import escape  # markup and control characters
    from pipeline.core.ui import out as stdout
    from pipeline.store import folder_names as folders

    r = folders.load(recipe, overrides, engines_dir)
    for folder in deploy.deploy(r, engines_dir, out, targets, model_version, instances,
                                allow_failed_gates):
        files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        stdout.print(f"[green]✓[/] {escape(str(folder))}: {escape(', '.join(files))}", soft_wrap=True)


@cli.command("bench")
@recipe_options
@click.option("--vs", "versus", metavar="RECIPE", default=None,
              help="Also time this recipe's engines and baseline, interleaved, and compare.")
def bench_command(recipe, overrides, force, engines_dir, verbose, only, versus):
    """Benchmark a recipe's engines vs PyTorch (and vs another recipe): verdicts with 95% CIs.

    Builds what is missing first; writes engines/RECIPE/bench.json and a latency PNG.
    """
    from pipeline.commands.bench import bench, tables
    from pipeline.core.ui import Progress, console, out
    from pipeline.store import folder_names as folders

    main = folders.load(recipe, overrides, engines_dir)
    other = folders.load(versus, overrides, engines_dir) if versus else None  # the same --set for both
    if other is not None and other.name == main.name:
        raise PipelineRecipeError(f"bench --vs {versus}: `{main.name}` against itself times one "
                                  "recipe twice", "name another recipe, e.g. --vs flash")
    result, path = bench(main, other, engines_dir, force, Progress(verbose), verbose, only)
    for t in tables(result):
        out.print(t)
    console.print(f"bench: {path}")


@cli.command("compare")
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
    from pipeline.commands.compare import compare
    from pipeline.core.ui import Progress, console, out
    from pipeline.store import folder_names as folders

    if load:  # pipeline/loadgen/compare.py: no builds, the recorded load results only
        return __import__("pipeline.loadgen.compare", fromlist=["_"]).show(recipes, overrides, engines_dir)
    loaded = [folders.load(r, overrides, engines_dir) for r in recipes]
    compared = compare(loaded, engines_dir, force, Progress(verbose), verbose)
    for part in compared.printed:
        out.print(part)
    console.print("compare: " + ", ".join(str(f) for f in compared.files))


@cli.command("recipes")
@click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Recipe folder (default: ./recipes).")
@debug_option
def recipes_command(folder):
    """List the recipes and what each one is."""
    from rich.table import Table

    from pipeline import recipe as recipe_mod
    from pipeline.core.errors import InputError
    from pipeline.core.ui import out

    where = folder if folder is not None else recipe_mod.recipes_dir()
    if not where.is_dir():
        raise InputError(f"{'--dir ' if folder is not None else ''}{where}: no such folder",
                         "run in a project with a recipes/ folder, or pass --dir DIR")
    t = Table("name", "description", "model", "targets", title="recipes")
    for path in recipe_mod.list_recipes(folder):
        try:
            r = recipe_mod.load(path)
            hf = r.model.transformers
            model = r.model.zoo or r.model.factory or (
                f"transformers {(hf.config or {}).get('model_type') or hf.pretrained or f'GGUF {hf.gguf}'}")
            kw = ", ".join(f"{k}={v}" for k, v in r.model.kwargs.items() if k in ("size", "attention", "ffn_prune"))
            t.add_row(r.name, r.description, f"{model} ({kw})" if kw else model,
                      ", ".join(x.id for x in r.targets))
        except PipelineError as e:
            t.add_row(path.stem, f"[red]invalid: {e}[/]", "", "")
    out.print(t)


@cli.command("schema")
@click.argument("what", type=click.Choice(["recipe", "report", "manifest"]))
@debug_option
def schema_command(what):
    """Print the JSON Schema of a recipe file, report.json or manifest.json, made from the
    pydantic models the pipeline itself validates with (e.g. for an editor's YAML support:
    `pipeline schema recipe > recipe.schema.json`)."""
    import json

    from pipeline.recipe.file_schema import DIALECT, recipe_file_schema

    if what == "recipe":
        schema = recipe_file_schema()
    else:
        from pipeline.artifacts import Manifest, Report

        model = Report if what == "report" else Manifest
        schema = {"$schema": DIALECT, **model.model_json_schema(by_alias=True)}
    click.echo(json.dumps(schema, indent=2))


@cli.command("tune")
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
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where the chosen recipe goes (default: RECIPE-tuned.yaml beside RECIPE).")
@engines_dir_option()
@click.option("-v", "--verbose", is_flag=True, help="Show the tools' own output.")
@debug_option
def tune_command(recipe, overrides, feeds_ref, worst_cosine, mean_cosine, max_task_loss, schemes,
                 alphas, no_exclusions, within_only, out, engines_dir, verbose):
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
        not within_only, _task_loss_value(max_task_loss))
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


@cli.command("inspect")
@click.argument("onnx_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON.")
@debug_option
def inspect_command(onnx_file, as_json):
    """Op histogram, inputs and outputs with shapes, and size of an ONNX file."""
    import json

    from pipeline.core.ui import out
    from pipeline.model import onnx_info

    info = onnx_info.describe(onnx_file)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    for part in onnx_info.render(info):
        out.print(part)


cli.add_command(fleet)  # pipeline/fleet/cli.py: `pipeline fleet` builds on a Ray cluster
cli.add_command(serve_command)  # pipeline/serving/cli.py: `pipeline serve` on Ray Serve
cli.add_command(__import__("pipeline.cli.load", fromlist=["_"]).load_command)  # `pipeline load`


def _fail(message: str, code: int, debug: bool) -> None:
    """One `Error:` line and the error's own exit code; under --debug the trace first."""
    if debug:
        import traceback

        traceback.print_exc()
    click.echo(printable(message.replace("\n", " ")), err=True)  # a file's ESC never raw
    sys.exit(code)

INTERRUPTED = "Interrupted; finished artifacts are kept, a rerun resumes."
cli.add_command(generate_command)


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one `Error:` line and their exit code."""
    meta: dict = {}  # this invocation's state (--debug), read here after the command ended
    try:
        rv = cli.main(args=argv, prog_name="pipeline", standalone_mode=False, obj=meta)
    except PipelineError as e:
        _fail(f"Error: {e}", e.exit_code, meta.get(DEBUG, False))
    except click.exceptions.Abort as e:
        # click turns Ctrl-C (KeyboardInterrupt) into Abort before it gets here
        interrupted = isinstance(e.__cause__, KeyboardInterrupt)
        click.echo(INTERRUPTED if interrupted else "Aborted.", err=True)
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as e:  # bare `pipeline`: the help, a success
        e.show()
        sys.exit(0)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except OSError as e:  # the machine's to fix (disk full, read-only, permissions): no trace
        _fail(f"Error: {e} (rerun with --debug for the trace)", 4, meta.get(DEBUG, False))
    except KeyboardInterrupt:
        click.echo(INTERRUPTED, err=True)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
