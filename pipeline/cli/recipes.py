"""`pipeline recipes [--dir DIR]`: the recipes and what each one is, one table row each (an
invalid one says why, in its row)."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.options import debug_option


@click.command("recipes")
@click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Recipe folder (default: ./recipes).")
@debug_option
def recipes_command(folder):
    """List the recipes and what each one is."""
    from rich.table import Table

    from pipeline import recipe as recipe_mod
    from pipeline.core.errors import InputError, PipelineError
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
