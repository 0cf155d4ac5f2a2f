"""What `pipeline serve RECIPE` does (cli/serve.py holds its options): start a local Ray (or
join `--address`), deploy the chosen engine, send a first request and check it against the
engine in process (the cold start), record serve-start-<engine>.json, then serve until a
signal (or stop after the check), and record again with the replica's figures at the end.

The engine is chosen, and its folder verified, before Ray starts: a folder that `pipeline
verify` refuses stops here with exit 5; so is the port checked (a busy one is exit 2, nothing
started or written).

Signals: once it serves, SIGINT and SIGTERM stop it cleanly (the stop recorded, Serve and its
Ray shut down, every process Ray started ended) and the exit code is 0, as a server asked to
stop has done its job. While it starts, they interrupt it (the same clean-up) with 130 for
SIGINT and 143 for SIGTERM (128 + the signal), as the shell reports. `ray.init()` installs
its own SIGTERM handlers (a Python one that exits with code 15, then its core worker's C++
one that aborts: exit 134), so ours are installed again once Ray is up.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import threading
import time
from pathlib import Path

from pipeline.core.errors import InputError, RecipeError
from pipeline.core.json_object import JsonObject

STOP_GRACE_S = 2.0  # how long Ray's own processes get to show a stop signal reached them too


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
          engines_dir: Path, started: float, api_key: str | None = None) -> None:
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
    if spec.threads is None and not address:
        spec = spec.model_copy(update={"threads": local_threads(num_cpus, replicas or spec.replicas)})
    choice = choose(loaded, engines_dir, engine)  # exit 5 before Ray starts, as verify would
    if not address:  # a cluster's Serve listens on its own nodes
        check_port(host, port)
    stop = SignalStop()
    stop.install()
    with app.local_ray(num_cpus, address) as node:
        stop.install()  # again: ray.init() replaced them (see the module's docstring)
        ray_up = time.perf_counter() - started
        server = app.start(loaded, engines_dir, choice.target, spec, replicas, host, port,
                           owns_serve=not address, api_key=api_key)
        ready = time.perf_counter() - started
        body, answer, first_ms = coldstart.first_request(server, loaded)
        cold = time.perf_counter() - started
        checked = coldstart.check(loaded, engines_dir, choice.target, body, answer, spec.threads)
        fields = {"recipe": loaded.name, "engine": choice.target, "kind": choice.kind,
                  "sha256": choice.sha256, "replicas": replicas or spec.replicas,
                  "threads": spec.threads,
                  "cluster": "address" if address else "local", "ray_start_s": 0.0 if address else ray_up,
                  "ready_s": ready, "cold_start_s": cold, "first_request_ms": first_ms,
                  "checked": checked, "started": when}
        fields["replica"] = [_replica(server.handle.stats())]
        path = coldstart.record(loaded, engines_dir, fields)
        console.print(f"serving {loaded.name} ({choice.target}) at {server.url}  "
                      f"cold start {cold:.1f} s, first answer {checked}; {path}")
        if not check_only:
            console.print("Ctrl-C or SIGTERM stops it")
            stop.serve_until_signal()
        # a group-wide SIGTERM (systemd's stop) ends our Ray beside us: nothing more to ask it
        ours_alive = node is None or node.alive(grace_s=STOP_GRACE_S)
        if ours_alive:
            fields["replica"] = [_replica(server.handle.stats())]
        fields["stopped"] = now()
        coldstart.record(loaded, engines_dir, fields)
        if ours_alive:
            server.stop()


class SignalStop:
    """SIGINT and SIGTERM: while the server starts, they interrupt it (KeyboardInterrupt, exit
    130; SystemExit 143); while it serves, they end serve_until_signal(). A second signal while
    the first is handled is ignored, so the clean-up runs to its end."""

    def __init__(self):
        self._stopped = threading.Event()
        self._serving = False
        self._seen = False

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def serve_until_signal(self) -> None:
        self._serving = True
        self._stopped.wait()

    def _on_signal(self, signum: int, frame) -> None:
        if self._seen:
            return
        self._seen = True
        self._stopped.set()
        if self._serving:
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)


def check_port(host: str, port: int) -> None:
    """Refuse, before anything starts, a port this host cannot listen on: taken by another
    server (whose answers the first-request check would read), not this machine's address,
    or a privileged port. The probe binds as the HTTP proxy does (SO_REUSEADDR: a port in
    TIME_WAIT is free, one another socket listens on is not)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise InputError(f"--host {host}: not an address of this machine ({e.strerror})",
                         "e.g. --host 127.0.0.1, or 0.0.0.0 for every interface") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
            probe.listen(1)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise InputError(f"--port {port}: {host}:{port} is already in use by another "
                                 "server", "stop it, or pick another --port") from None
            raise InputError(f"--host {host} --port {port}: cannot listen there ({e.strerror})",
                             "pick another --host or --port") from None


def local_threads(num_cpus: int | None, replicas: int) -> int:
    """Intra-op threads per replica of a local server when the recipe names none: the local
    Ray's CPUs split among its replicas, as llama-server, vLLM's CPU backend and ONNX Runtime
    take every core by default (one thread left the chat engine at half a 2-core machine)."""
    cores = num_cpus or len(os.sched_getaffinity(0))
    return max(1, cores // max(1, replicas))


def _replica(stats: JsonObject) -> JsonObject:
    """The replica's figures the start record keeps (its stats also carry live counters)."""
    keys = ("node_id", "pid", "load_s", "rss_at_load_mb", "rss_mb", "peak_rss_mb", "requests")
    return {k: stats[k] for k in keys}
