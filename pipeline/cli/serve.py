"""`pipeline serve RECIPE`: a built engine of the recipe as an HTTP service on Ray Serve.

Starts a local Ray instance (stopped on exit) or joins `--address`; refuses a folder that
`pipeline verify` refuses (exit 5) before Ray starts; sends itself a first request and
checks it against the engine in process (the cold start), writes serve-start-<engine>.json,
then serves until Ctrl-C or SIGTERM (`--check-only`: stops after the check).
Top-level imports stay light: ray is imported when the command runs.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import click

from pipeline.cli.options import debug_option


def _serve_overrides(recipe, items: tuple[str, ...]):
    """`--set serve.KEY=VALUE` on top of the recipe's serve section (never another section:
    the engines folder is the recipe's own, whatever is served from it)."""
    import yaml

    from pipeline.core.errors import RecipeError
    from pipeline.recipe.serve import ServeSpec
    from pipeline.recipe.serve import check as check_serve

    values = recipe.serve.model_dump(exclude_unset=True)
    for item in items:
        key, sep, raw = item.partition("=")
        path = key.split(".")
        if not sep or len(path) != 2 or path[0] != "serve":
            raise RecipeError(f"--set {item}: `pipeline serve` takes only serve.KEY=VALUE "
                              "(e.g. --set serve.max_batch_size=1)",
                              "build other variants with `pipeline run RECIPE --set ...`, then "
                              "serve their folder name")
        values[path[1]] = yaml.safe_load(raw)
    try:
        spec = ServeSpec.model_validate(values)
        check_serve(spec, recipe.inputs)
    except ValueError as e:
        raise RecipeError(f"--set: serve: {str(e).splitlines()[-1].strip()}") from None
    return spec


@click.command("serve")
@click.argument("recipe")
@click.option("--engine", default=None, metavar="TARGET|KIND|pytorch",
              help="The engine to serve (default: the first built one that runs here).")
@click.option("--replicas", type=click.IntRange(1, 64), default=None, help="Replicas (default: serve.replicas).")
@click.option("--address", default=None, help="Join this Ray cluster (e.g. ray://head:10001 or "
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
@debug_option
def serve_command(recipe, engine, replicas, address, host, port, num_cpus, overrides, check_only,
                  engines_dir):
    """Serve a built engine of RECIPE over HTTP (Ray Serve, dynamic batching).

    POST /v1/models/RECIPE/infer {"inputs": {...}} (one sample, batch dim 1), or
    /generate for generation engines; GET .../ready, .../stats, /health. See docs/serving.md.
    """
    started = time.perf_counter()
    from pipeline.core.ui import console
    from pipeline.serving import app, coldstart
    from pipeline.serving.engine import choose
    from pipeline.store.folder_names import load
    from pipeline.store.recipe_folder import now

    when = now()
    loaded = load(recipe, (), engines_dir)
    spec = _serve_overrides(loaded, overrides)
    choice = choose(loaded, engines_dir, engine)  # exit 5 before Ray starts, as verify would
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with app.local_ray(num_cpus, address):
        ray_up = time.perf_counter() - started
        server = app.start(loaded, engines_dir, choice.target, spec, replicas, host, port,
                           owns_serve=not address)
        ready = time.perf_counter() - started
        body, answer, first_ms = coldstart.first_request(server, loaded)
        cold = time.perf_counter() - started
        checked = coldstart.check(loaded, engines_dir, choice.target, body, answer, spec.threads)
        fields = {"recipe": loaded.name, "engine": choice.target, "kind": choice.kind,
                  "sha256": choice.sha256, "replicas": replicas or spec.replicas,
                  "cluster": "address" if address else "local", "ray_start_s": 0.0 if address else ray_up,
                  "ready_s": ready, "cold_start_s": cold, "first_request_ms": first_ms,
                  "checked": checked, "started": when}
        fields["replica"] = [_replica(server.handle.stats())]
        path = coldstart.record(loaded, engines_dir, fields)
        console.print(f"serving {loaded.name} ({choice.target}) at {server.url}  "
                      f"cold start {cold:.1f} s, first answer {checked}; {path}")
        if not check_only:
            console.print("Ctrl-C or SIGTERM stops it")
            stop.wait()
        fields["replica"] = [_replica(server.handle.stats())]
        fields["stopped"] = now()
        coldstart.record(loaded, engines_dir, fields)
        server.stop()


def _replica(stats: dict) -> dict:
    keys = ("node_id", "pid", "load_s", "rss_at_load_mb", "rss_mb", "peak_rss_mb", "requests")
    return {k: stats[k] for k in keys}
