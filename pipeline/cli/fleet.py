"""`pipeline fleet`: build a matrix of recipes x device kinds on a Ray cluster.

    pipeline fleet [build] RECIPES... | --all [--address ADDR] [--devices KIND,...]
    pipeline fleet node [--kind KIND] [--address ADDR] [--start]
    pipeline fleet compare RECIPE

The work is fleet/'s (run.build, kinds, summary); this module holds the commands only.
Top-level imports stay light: ray is imported when a command runs, never by `--help`.
"""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.options import debug_option, engines_dir_option, positive_seconds, ray_address
from pipeline.core.errors import PipelineError, RecipeError

SUBCOMMANDS = ("build", "node", "compare")


class FleetFailed(PipelineError):
    """Some pairs failed or missed a gate: the exit code is the worst pair's."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class _BuildByDefault(click.Group):
    """`pipeline fleet standard ...` means `pipeline fleet build standard ...`."""

    def parse_args(self, ctx, args):
        if args and args[0] not in SUBCOMMANDS and args[0] not in ("-h", "--help"):
            args = ["build", *args]
        return super().parse_args(ctx, args)


@click.group("fleet", cls=_BuildByDefault)
def fleet():
    """Build recipes on a Ray cluster, each on a node of the device kind it is for
    (`pipeline fleet RECIPES...` is `pipeline fleet build RECIPES...`). See docs/fleet.md."""


def _kinds(text: str | None) -> list[str] | None:
    from pipeline.fleet import kinds

    if not text:
        return None
    wanted = [k.strip() for k in text.split(",") if k.strip()]
    for kind in wanted:
        if kinds.problem(kind):
            raise RecipeError(f"--devices: {kinds.problem(kind)}")
    return wanted


@fleet.command("build")
@click.argument("recipes", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Every recipe under recipes/.")
@click.option("--address", default=None, callback=ray_address, help="Join this Ray cluster "
              "(host:port, ray://host:port, or `auto`); default: start a local one for this command.")
@click.option("--devices", default=None, metavar="KIND,...", help="Device kinds to build for "
              "(e.g. cpu-avx512_vnni,gpu-nvidia-h200); default: every kind a node advertises.")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Override a value in every recipe (repeatable); folders get their @<digest> name.")
@click.option("--ship", is_flag=True, help="Send this folder (recipes, data, model code) to the "
              "nodes with each job (Ray's runtime_env working_dir); default: nodes run from the "
              "same path in their own checkout.")
@click.option("--timeout", "timeout_s", type=float, default=None, callback=positive_seconds,
              help="Seconds one job may run (above 0).")
@engines_dir_option("Where engines/fleet/<kind>/<recipe>/ and fleet.json go (env PIPELINE_ENGINES).")
@debug_option
def build_command(recipes, everything, address, devices, overrides, ship, timeout_s, engines_dir):
    """Build each RECIPE for each device kind on a node of that kind; verified results land in
    engines/fleet/<kind>/<recipe>/, the summary in engines/fleet/fleet.json."""
    from pipeline.fleet import run

    if bool(recipes) == everything:
        raise RecipeError("name the recipes to build, or --all (not both)",
                          "e.g. `pipeline fleet standard standard-int8`")
    outcome = run.build(list(recipes), everything, address, _kinds(devices), timeout_s,
                        engines_dir, overrides, ship=ship)
    if outcome.exit_code:
        bad = [f"{p.recipe}@{p.kind}: {p.reason or 'exit ' + str(p.exit_code)}"
               for p in outcome.pairs if p.exit_code]
        raise FleetFailed(f"{len(bad)} of {len(outcome.pairs)} fleet jobs did not pass: "
                          + "; ".join(bad), outcome.exit_code)


@fleet.command("node")
@click.option("--kind", default=None, help="Advertise this kind (default: this machine's).")
@click.option("--address", default=None, callback=ray_address,
              help="The head to join, host:port (default: start a head).")
@click.option("--start", is_flag=True, help="Run `ray start` (default: print the command).")
@debug_option
def node_command(kind, address, start):
    """The `ray start` that makes this machine a fleet node of its device kind."""
    import subprocess

    from pipeline.core import deps
    from pipeline.fleet import kinds

    kind = kind or kinds.here()
    if kinds.problem(kind):
        raise RecipeError(f"--kind: {kinds.problem(kind)}")
    click.echo(f"# {deps.device_line(deps.device())}: device kind {kind}")
    click.echo(kinds.start_line(kind, address))
    if start:
        raise SystemExit(subprocess.run(kinds.start_command(kind, address)).returncode)


@fleet.command("compare")
@click.argument("recipe")
@engines_dir_option("Where engines/fleet/ is (env PIPELINE_ENGINES).")
@debug_option
def compare_command(recipe, engines_dir):
    """RECIPE's engines across the device kinds the fleet built it for, from their reports."""
    from pipeline.core.ui import out
    from pipeline.fleet import run
    from pipeline.fleet.summary import compare_table

    out.print(compare_table(recipe, run.reports(Path(engines_dir), recipe)))
