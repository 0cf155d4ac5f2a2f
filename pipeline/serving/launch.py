"""What `pipeline serve RECIPE` does (cli/serve.py holds its options): start a local Ray (or
join `--address`), deploy the chosen engine, send a first request and check it against the
engine in process (the cold start), record serve-start-<engine>.json, then serve until a
signal (or stop after the check), and record again with the replica's figures at the end.

The engine is chosen, and its folder verified, before Ray starts: a folder that `pipeline
verify` refuses stops here with exit 5.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from pipeline.core.errors import RecipeError
from pipeline.core.json_object import JsonObject


def serve_overrides(recipe, items: tuple[str, ...]):
    """`--set serve.KEY=VALUE` on top of the recipe's serve section (never another section:
    the engines folder is the recipe's own, whatever is served from it)."""
    import yaml

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


def serve(recipe: str, engine: str | None, replicas: int | None, address: str | None, host: str,
          port: int, num_cpus: int | None, overrides: tuple[str, ...], check_only: bool,
          engines_dir: Path, started: float) -> None:
    """Serve RECIPE's engine until SIGINT or SIGTERM (`check_only`: until the first answer is
    checked). `started`: the command's perf_counter at its start, so the recorded times
    (ray_start_s, ready_s, cold_start_s) count the imports too, as a user waits for them."""
    from pipeline.core.ui import console
    from pipeline.serving import app, coldstart
    from pipeline.serving.engine import choose
    from pipeline.store.folder_names import load
    from pipeline.store.recipe_folder import now

    when = now()
    loaded = load(recipe, (), engines_dir)
    spec = serve_overrides(loaded, overrides)
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


def _replica(stats: JsonObject) -> JsonObject:
    """The replica's figures the start record keeps (its stats also carry live counters)."""
    keys = ("node_id", "pid", "load_s", "rss_at_load_mb", "rss_mb", "peak_rss_mb", "requests")
    return {k: stats[k] for k in keys}
