"""Options the command modules share: `--debug` (and whether it was given), `--engines-dir`,
the set every recipe-running command takes (`recipe_options`), and the checks of a Ray
cluster's `--address` and of a timeout's seconds. Their own module, so that
each command module takes them without importing the group (pipeline/cli/__init__.py), which
imports every command module."""

from __future__ import annotations

import functools
import ipaddress
import math
import os
import re
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


# A host name (RFC 1123 labels; `_` as Docker's names have it) or an IPv4 address.
_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?")


def ray_address(ctx, param, value):
    """--address of a Ray cluster: `auto`, `local`, HOST:PORT (its GCS) or ray://HOST[:PORT]
    (Ray Client); HOST a name, an IPv4 address or [an IPv6 one]. Checked here, so a typo is
    one line (exit 2), not ray.init's traceback."""
    if value is None or value in ("auto", "local"):
        return value
    client = value.startswith("ray://")
    rest = value.removeprefix("ray://")
    host, colon, port = rest.rpartition(":") if not rest.endswith("]") else (rest, "", "")
    if not colon and client:
        host, port = rest, "10001"  # Ray Client's default port
    if host.startswith("[") and host.endswith("]"):
        try:
            ok_host = ipaddress.ip_address(host[1:-1]).version == 6
        except ValueError:
            ok_host = False
    else:
        ok_host = bool(_HOST.fullmatch(host)) and len(host) <= 253
    if not ok_host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise click.BadParameter(f"{value!r} is not a Ray address: use HOST:PORT (e.g. head:6379), "
                                 "ray://HOST:PORT (Ray Client, e.g. ray://head:10001) or auto",
                                 ctx=ctx, param=param)
    return value


def positive_seconds(ctx, param, value):
    """A number of seconds above 0 (not NaN, not infinite), or None."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"{value:g} is not a number of seconds above 0, e.g. 3600",
                                 ctx=ctx, param=param)
    return value
