"""What `pipeline load` does: load the recipe and its request bodies, reach (or start) the
server, run the mode asked for, write the result into the recipe's folder, print it."""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pipeline.artifacts.serving import Capacity, LoadPoint, LoadResult, Soak
from pipeline.core.errors import InputError, StageFailed
from pipeline.core.json_object import JsonObject


@dataclass
class Request:
    recipe: str
    overrides: tuple[str, ...]
    engines_dir: Path
    url: str | None
    model: str | None
    api: str | None
    start_server: bool
    engine: str | None
    name: str | None
    rate: float | None
    sweep: list[float] | None
    slo: str | None
    concurrency: int | None
    arrival: str
    burstiness: float
    duration: float
    warmup: float
    min_requests: int
    timeout: float
    seed: int
    max_points: int
    tolerance: float
    start_rate: float | None
    soak: bool
    windows: int
    leak_threshold: float
    server_pid: int | None
    tasks: bool = False          # --tasks: the recipe's multi-turn chat scripts
    think_time: float = 0.0      # seconds between a task's turns
    min_tasks: int | None = None  # measured tasks per point (default: what the SLO needs)
    distinct_tasks: bool = False  # --distinct-tasks: no two conversations share a prefix


def mode_of(req: Request) -> str:
    """One mode per run; InputError when the flags ask for two or none."""
    if bool(req.url) == bool(req.start_server):
        raise InputError("name the server: --url URL (a running one) or --serve (start it here)",
                         "e.g. pipeline load minilm-int8 --serve --rate 20")
    if req.model and not req.url:
        raise InputError("--model names the model on a running server: it needs --url",
                         "with --serve the server serves the recipe under its own name")
    asked = [m for m, on in (("closed", req.concurrency), ("sweep", req.sweep),
                             ("rate", req.rate is not None)) if on]
    if len(asked) > 1:
        raise InputError(f"--{' and --'.join('concurrency' if m == 'closed' else m for m in asked)} "
                         "ask for two modes", "give one of --rate, --sweep, --concurrency")
    if req.tasks and req.soak:
        raise InputError("--soak with --tasks: a soak holds single requests at a rate",
                         "drop --soak, or drop --tasks")
    if req.tasks and req.api not in (None, "chat"):
        raise InputError(f"--api {req.api} with --tasks: tasks are chats, sent to "
                         "/v1/chat/completions", "drop --api")
    if not req.tasks and (req.think_time or req.min_tasks or req.distinct_tasks):
        flag = "think-time" if req.think_time else "min-tasks" if req.min_tasks else "distinct-tasks"
        raise InputError(f"--{flag} needs --tasks",
                         "add --tasks to send the recipe's multi-turn chat tasks")
    if req.soak and asked != ["rate"]:
        raise InputError("--soak needs --rate (the rate held for --duration)", "add --rate R")
    bad = [o for o in req.overrides if not o.startswith("serve.") or "=" not in o]
    if bad:
        raise InputError(f"--set {bad[0]}: `pipeline load` passes only serve.KEY=VALUE on to "
                         "`pipeline serve`", "load-test another recipe variant by naming its "
                         "engines folder, e.g. `pipeline load minilm@1a2b3c4d`")
    if req.overrides and not req.start_server:
        raise InputError("--set needs --serve: a running server (--url) has its settings already",
                         "drop --set, or start the server here with --serve")
    if req.overrides and not req.name:
        raise InputError(f"--set {req.overrides[0]}: name this serving variant with --name (e.g. "
                         "--name b1)", "its result is then load-<engine>-<name>.json, beside the "
                         "default's")
    if req.soak:
        return "soak"
    if asked:
        return asked[0]
    if req.slo:
        return "capacity"
    raise InputError("nothing to measure: give --rate, --sweep, --concurrency or --slo",
                     "e.g. --slo p99=50ms finds the capacity")


@dataclass
class Reached:
    """The server as this run reached it: started here (proc) or running at --url."""

    proc: object | None  # server.ServeProcess when started here
    base: str
    model: str
    info: JsonObject     # its readiness answer
    target: object       # protocol.Target
    stats: JsonObject | None
    pid: int | None      # the server process sampled for CPU and memory
    engine: str

    def headline(self) -> str:
        how = f"started here, {self.proc.started_s:.1f} s to ready" if self.proc else "running"
        return f"{self.target.endpoint} ({how})"

    def record(self, req: Request, protocol_name: str, metrics_why: str | None) -> JsonObject:
        """LoadResult.server: how it was reached or started, and what it said of itself."""
        return {"started_here": bool(req.start_server), "base_url": self.base, "model": self.model,
                "protocol": protocol_name, "ready": self.info,
                "ready_after_s": self.proc.started_s if self.proc else None,
                "sampled_pid": self.pid, "serve_overrides": list(req.overrides),
                "stats": self.stats,
                "metrics": (f"{self.base}/metrics scraped around each point" if metrics_why is None
                            else f"not scraped: {metrics_why}")}


@contextlib.contextmanager
def reach(req: Request, recipe, api: str, logs: Path):
    """The server (started with --serve, stopped when the block ends) as a Reached; its
    `stats` are read again at the end of the block (its batches, its memory)."""
    from pipeline.loadgen import protocol, server

    with server_for(req, api, logs) as proc:
        base, model = (proc.url, recipe.name) if proc else \
            protocol.resolve(req.url, req.model, recipe.name)
        info = proc.ready_info if proc else server.wait_ready(server.ready_route(base, api), 30.0)
        target = target_for(base, model, api, info)
        stats = server.stats(base, model)  # `pipeline serve`'s own view, if that is the server
        pid = proc.pid if proc else (req.server_pid or _replica_pid(stats))
        engine = req.engine or (stats or {}).get("engine") or recipe.targets[0].id
        reached = Reached(proc, base, model, info, target, stats, pid, engine)
        yield reached
        reached.stats = server.stats(base, model) or stats


def run(req: Request) -> None:
    """Measure as `req` asks, write load-*.json (and its plot) into the recipe's folder, print
    the points as they come and where the result went."""
    from pipeline.loadgen import turns

    side = RequestRun.prepare(req)
    logs = Path(tempfile.mkdtemp(prefix="pipeline-load-"))
    with reach(req, side.recipe, side.api, logs) as got:
        side.start(got)
        measured = turns.alone(side.plan())
    side.write(measured, got, logs)


@dataclass
class RequestRun:
    """One recipe's load run of single requests: prepared before any server is reached,
    started on the server, its mode a plan (turns.py), its result written."""

    req: Request
    mode: str
    recipe: object
    folder: str
    api: str
    settings: object   # loadtest.Settings
    label: str = ""    # printed before each point's line (two runs in turns: which one)
    test: object = None
    requests_info: JsonObject | None = None
    default_name: ClassVar[str | None] = None  # the result's name without --name

    @classmethod
    def prepare(cls, req: Request, label: str = "") -> RequestRun:
        from pipeline.loadgen import payloads, slo
        from pipeline.loadgen.loadtest import Settings
        from pipeline.store import folder_names as folders

        mode = mode_of(req)
        recipe = folders.load(req.recipe, (), req.engines_dir)  # RECIPE or its <name>@<digest> folder
        generation = payloads.is_generation(recipe)
        terms = slo.parse(req.slo, generation)
        check_engine(req, recipe)
        settings = Settings(arrival=req.arrival, burstiness=req.burstiness, duration=req.duration,
                            warmup=req.warmup, min_requests=req.min_requests, timeout=req.timeout,
                            seed=req.seed, terms=terms, generation=generation)
        return cls(req, mode, recipe, folders.folder_name(recipe), payloads.api_of(recipe, req.api),
                   settings, label)

    def start(self, got: Reached) -> None:
        from pipeline.core.ui import console
        from pipeline.loadgen import payloads
        from pipeline.loadgen.loadtest import LoadTest

        bodies, self.requests_info = payloads.bodies(self.recipe, got.target)
        console.print(f"load{self.label}: {got.headline()}; {len(bodies)} request bodies from "
                      f"{self.requests_info['source']}; {self.requests_info['protocol']}")
        self.test = LoadTest(got.target, bodies, self.settings, got.pid,
                             on_point=lambda p: console.print(self.label + _line(p)))

    def plan(self):
        return plan(self.test, self.mode, self.req)

    def write(self, measured: _Measured, got: Reached, logs: Path,
              interleaved_with: str | None = None) -> Path:
        from pipeline import workloads
        from pipeline.core import deps
        from pipeline.loadgen import artifact, schedule, slo
        from pipeline.store.recipe_folder import Store, now

        req, terms = self.req, self.settings.terms
        _refuse_all_failed(measured.points)
        result = LoadResult.model_validate({  # a capacity or soak only where the mode has one
            "points": measured.points,
            **({"capacity": measured.capacity} if measured.capacity else {}),
            **({"soak": measured.soak} if measured.soak else {}),
            "schema": 1, "recipe": self.folder, "engine": got.engine, "name": req.name,
            "created": now(), "url": got.target.endpoint, "mode": self.mode,
            "arrival": schedule.describe(req.arrival, req.burstiness),
            "burstiness": req.burstiness, "seed": req.seed, "slo": slo.text(terms) or None,
            "requests": self.requests_info, "device": deps.device(),
            "client": client_info(req, interleaved_with),
            "server": got.record(req, self.requests_info["protocol"], self.test.metrics_why),
        })
        png = logs / "plot.png"
        _plot(png, result, req, self.mode, terms, self.folder, got.engine)
        path = artifact.write(result, png, Store(req.engines_dir, self.folder),
                              workloads.of(self.recipe))
        print_outcome(result, path)
        return path


def plan(test, mode: str, req: Request):
    """The mode's points as a plan (turns.py: one step per point), for a LoadTest or a
    TaskLoadTest (at(rate), closed(users), probe_rate(); soak: LoadTest only)."""
    from pipeline.loadgen import capacity, turns

    if mode == "closed":
        return _Measured([(yield lambda: test.closed(req.concurrency))])
    if mode == "rate":
        return _Measured([(yield lambda: test.at(req.rate))])
    if mode == "sweep":
        points = []
        for rate in req.sweep:
            points.append((yield lambda rate=rate: test.at(rate)))
        return _Measured(points)
    if mode == "soak":
        point, soak = yield lambda: test.soak(req.rate, req.windows, req.leak_threshold)
        return _Measured([point], soak=soak)
    start = req.start_rate or (yield test.probe_rate)
    found, points = yield from turns.each(
        capacity.search_steps(start, max_points=req.max_points, tolerance=req.tolerance), test.at)
    return _Measured(points, capacity=found)


def client_info(req: Request, interleaved_with: str | None = None) -> JsonObject:
    """LoadResult.client: the generator's own limits, and the run measured in turns with it."""
    info = {"duration_s": req.duration, "warmup_s": req.warmup, "min_requests": req.min_requests,
            "timeout_s": req.timeout,
            "process": "pipeline load (its own process; aiohttp, one event loop)"}
    if interleaved_with:
        info["interleaved_with"] = interleaved_with
    return info


def check_engine(req: Request, recipe) -> None:
    """InputError when --engine names no target of the recipe."""
    if req.engine and req.engine not in {t.id for t in recipe.targets}:
        raise InputError(f"--engine {req.engine}: `{recipe.name}` has no such target",
                         f"one of {', '.join(t.id for t in recipe.targets)}")


def server_for(req: Request, api: str, logs: Path):
    """With --serve, the server process to start (its context manager); else a context that
    yields None (the server at --url runs already)."""
    from pipeline.loadgen import server

    if req.start_server:
        return server.ServeProcess(req.recipe, api, req.overrides, req.engines_dir,
                                   req.engine, logs / "serve.log")
    return contextlib.nullcontext()


def target_for(base: str, model: str, api: str, ready: dict):
    """The Target, once the server is known to serve `model` in that protocol: KServe v2's
    model metadata answers (and binary tensors where GET /v2 lists the extension), or the
    OpenAI API's model list names it. InputError naming what the server does serve."""
    from pipeline.loadgen import server
    from pipeline.loadgen.protocol import Target

    if api == "kserve":
        if server.get_json(f"{base}/v2/models/{model}") is None:
            raise InputError(f"{base} serves no model `{model}` over KServe v2 (GET "
                             f"/v2/models/{model} did not answer 200)",
                             "name the served model with --model NAME")
        extensions = (server.get_json(f"{base}/v2") or {}).get("extensions")
        binary = isinstance(extensions, list) and "binary_tensor_data" in extensions
        return Target(base, model, "kserve", binary)
    listed = ready.get("data") if isinstance(ready, dict) else None
    ids = [m.get("id") for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []
    if ids and model not in ids:
        raise InputError(f"{base}/v1/models lists {', '.join(map(str, ids[:5]))}, not `{model}`",
                         "name the served model with --model NAME")
    return Target(base, model, api)


def _refuse_all_failed(points: list[LoadPoint]) -> None:
    """StageFailed (exit 4) when no measured request of any point was answered: a run that
    measured nothing writes nothing (an earlier result of the same name stays)."""
    measured = sum(p.requests for p in points)
    if any(p.ok for p in points):
        return
    examples = sorted({e for p in points for e in p.error_examples})[:2]
    why = "; ".join(examples) or (f"{sum(p.rejected for p in points)} rejected, "
                                  f"{sum(p.timeouts for p in points)} timed out")
    raise StageFailed(f"every one of the {measured} measured requests failed ({why[:300]}); "
                      "nothing written", "check the server's log, the URL and --model")


def _plot(png: Path, result: LoadResult, req: Request, mode: str, terms, folder: str,
          engine: str) -> None:
    """The soak's windows, or the points' latency against rate with the SLO's latency bound."""
    from pipeline.loadgen import plots

    if mode == "soak":
        plots.soak_png(png, result.soak.windows, f"soak: {folder} at {req.rate:g}/s")
    else:
        bound = next((t.bound_ms for t in terms if t.metric == "latency"), None)
        plots.knee_png(png, result.points, f"{folder} ({engine}): {mode}", bound)


def print_outcome(result: LoadResult, path: Path) -> None:
    """The capacity found or the soak's verdict, when measured, then where the result went."""
    from pipeline.core.ui import console

    cap = result.capacity
    if cap:
        console.print(f"capacity: {cap.capacity} requests/s (bracket {cap.bracket}; {cap.why})")
    if result.soak:
        v = result.soak.verdict
        console.print(f"soak: {v.leak} ({v.why})")
    console.print(f"load: {path}")


@dataclass(frozen=True)
class _Measured:
    """What one mode measured: its points, and the capacity or the soak when it has one."""

    points: list[LoadPoint]
    capacity: Capacity | None = None
    soak: Soak | None = None


def _replica_pid(stats: dict | None) -> int | None:
    """With --url and no --server-pid: the replica's pid from `pipeline serve`'s /stats, when
    that process runs on this machine (a remote one is not sampled)."""
    import psutil

    pid = (stats or {}).get("pid")
    return pid if isinstance(pid, int) and psutil.pid_exists(pid) else None


def _line(p: LoadPoint) -> str:
    q = p.latency_ms
    fmt = lambda x: "—" if x.value is None else f"{x.value:.1f}"  # noqa: E731
    verdict = "" if p.passed is None else ("  pass" if p.passed else "  FAIL")
    moved = p.server_metrics
    if moved and moved.mean_batch is not None:  # what the server's own histogram saw
        verdict = f", server batch mean {moved.mean_batch:.2f} ({moved.batch_histogram}){verdict}"
    who = f"{p.concurrency} users" if p.concurrency else f"{p.offered_rate:.2f}/s offered"
    return (f"  {who} ({p.scheduled_rate:.2f}/s scheduled): achieved {p.achieved_rate:.2f}/s, "
            f"n {p.requests}, failed "
            f"{p.requests - p.ok}, p50 {fmt(q['p50'])} ms, p99 {fmt(q['p99'])} ms, "
            f"late {p.late.share:.1%}{verdict}")
