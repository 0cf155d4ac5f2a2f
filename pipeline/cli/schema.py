"""`pipeline schema recipe|report|manifest`: the JSON Schema of a file the pipeline reads or
writes, made from the pydantic models it validates with."""

from __future__ import annotations

import click

from pipeline.cli.options import debug_option


@click.command("schema")
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
