"""`pipeline deploy RECIPE --triton DIR`: the recipe's validated engines as Triton model
folders (the work is commands/deploy.py's)."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.options import debug_option, engines_dir_option


@click.command("deploy")
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
