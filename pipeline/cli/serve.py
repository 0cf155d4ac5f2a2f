"""`pipeline serve RECIPE`: a built engine of the recipe as an HTTP service on Ray Serve.

Starts a local Ray instance (stopped on exit) or joins `--address`; refuses a folder that
`pipeline verify` refuses (exit 5) before Ray starts; sends itself a first request and
checks it against the engine in process (the cold start), writes serve-start-<engine>.json,
then serves until Ctrl-C or SIGTERM (`--check-only`: stops after the check). The work is
serving/launch.py's; this module holds the options.
Top-level imports stay light: ray is imported when the command runs.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from pipeline.cli.options import debug_option, ray_address


@click.command("serve")
@click.argument("recipe")
@click.option("--engine", default=None, metavar="TARGET|KIND|pytorch",
              help="The engine to serve (default: the first built one that runs here).")
@click.option("--replicas", type=click.IntRange(1, 64), default=None, help="Replicas (default: serve.replicas).")
@click.option("--address", default=None, callback=ray_address, help="Join this Ray cluster (e.g. ray://head:10001 or "
              "head:6379) instead of starting a local Ray.")
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="HTTP port.")
@click.option("--num-cpus", type=click.IntRange(1), default=None, help="CPUs of the local Ray (default: all).")
@click.option("--set", "overrides", multiple=True, metavar="serve.KEY=VALUE",
              help="Override a serve: setting, e.g. --set serve.max_batch_size=1 (repeatable).")
@click.option("--check-only", is_flag=True, help="Start, check the first response, record the "
              "cold start, and stop.")
@click.option("--engines-dir", type=click.Path(file_okay=False, path_type=Path), default="engines",
              show_default=True, envvar="PIPELINE_ENGINES", help="Where the engines/<recipe>/ folders are.")
@click.option("--api-key", default=None, envvar="PIPELINE_API_KEY", show_envvar=True,
              help="Requests must send `Authorization: Bearer KEY` (all routes but /health and "
              "/v2/health/*); required with a --host beyond loopback.")
@debug_option
def serve_command(recipe, engine, replicas, address, host, port, num_cpus, overrides, check_only,
                  engines_dir, api_key):
    """Serve a built engine of RECIPE over HTTP (Ray Serve, dynamic batching).

    POST /v1/models/RECIPE/infer {"inputs": {...}} (one sample, batch dim 1), or
    /generate for generation engines; GET .../ready, .../stats, /health. See docs/serving.md.
    """
    started = time.perf_counter()  # before the imports: a user waits for them too
    if not api_key and not _loopback(host):
        from pipeline.core.errors import InputError

        raise InputError(f"--host {host} serves beyond this machine with no API key: give "
                         "--api-key KEY (or PIPELINE_API_KEY), or serve on --host 127.0.0.1")
    from pipeline.serving import launch

    launch.serve(recipe, engine, replicas, address, host, port, num_cpus, overrides, check_only,
                 engines_dir, started, api_key or None)


def _loopback(host: str) -> bool:
    """Only this machine can reach `host` (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve beyond loopback
        return False
