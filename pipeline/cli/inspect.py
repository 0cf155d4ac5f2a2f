"""`pipeline inspect FILE.onnx [--json]`: an ONNX file's op histogram, inputs, outputs and size
(model/onnx_info.py reads them)."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.options import debug_option


@click.command("inspect")
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
        click.echo(json.dumps(info.dump(), indent=2))
        return
    for part in onnx_info.render(info):
        out.print(part)
