"""Options every command module shares: `--debug` (and whether it was given) and
`--engines-dir`. Their own module, so that a command defined outside cli.py (e.g.
pipeline/fleet/cli.py) takes them without importing cli.py, which imports it."""

from __future__ import annotations

import os
from pathlib import Path

import click

DEBUG = "debug"  # key of the invocation's state (ctx.obj: one dict per main() call, shared by
# the group's and the command's contexts), read by main() after the command ended


def _set_debug(ctx, param, value):
    if isinstance(ctx.obj, dict):
        ctx.obj[DEBUG] = ctx.obj.get(DEBUG, False) or bool(value)
    return value


def debug_option(fn):
    """--debug, accepted by every command (and the group): errors also show their traceback."""
    return click.option("--debug", is_flag=True, expose_value=False, callback=_set_debug,
                        is_eager=True, help="Show the traceback of errors (same exit codes).")(fn)


def _engines_dir(ctx, param, value):
    if value is None or not str(value).strip():
        raise click.BadParameter("is empty (from the option or PIPELINE_ENGINES); name a folder, "
                                 "e.g. --engines-dir engines", ctx=ctx, param=param)
    return Path(value)


def engines_dir_option(help_text: str = "Where the engines/<recipe>/ folders are (env PIPELINE_ENGINES)."):
    return click.option("--engines-dir", type=click.Path(file_okay=False), callback=_engines_dir,
                        default=lambda: os.environ.get("PIPELINE_ENGINES", "engines"),
                        show_default="engines", help=help_text)
