"""One `pipeline fleet build`: recipes checked here, pairs chosen, jobs run, fleet.json written.

Every recipe is loaded on this machine first (a bad one is exit 2 before Ray starts); the
device kinds are the ones asked for, or every kind a node of the cluster advertises; a kind
no node advertises is refused at once (exit 2) rather than left waiting forever.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from pipeline.artifacts.report import Report
from pipeline.core.errors import DependencyError, IntegrityError
from pipeline.fleet import jobs, kinds
from pipeline.fleet.summary import FILE, FleetRun, engine_lines, table

# Never shipped with --ship: outputs, environments, history (gitignore-style patterns).
SHIP_EXCLUDES = ["engines/", ".venv/", ".git/", "__pycache__/", "*.pyc", ".pytest_cache/"]
RecipeRefs = dict[str, str]  # an engines folder's name -> the recipe as `pipeline run` takes it
KindReports = dict[str, Report]  # a device kind -> the report the fleet accepted for it
_STATE_STYLE = {"queued": "dim", "running": "yellow", "done": "green", "failed": "red"}


def _recipes(names: list[str], everything: bool, overrides: tuple[str, ...]) -> RecipeRefs:
    """{engines folder name: how to name the recipe to `pipeline run`}, each loaded (and so
    checked) here with the --set values; the folder is <recipe>[@<digest of the values>]."""
    from pipeline.recipe.loader import list_recipes
    from pipeline.store import folder_names as folders

    refs = [str(p) for p in list_recipes()] if everything else names
    loaded = {}
    for ref in refs:
        loaded[folders.folder_name(folders.load(ref, overrides))] = ref
    return loaded


@contextlib.contextmanager
def connected(address: str | None, ship: bool = False):
    """Ray, joined at `address` or started here for this command (this machine's kind as
    its one device resource; on loopback, stopped after it with every process it started);
    yields how fleet.json names it. `ship`:
    this folder goes to every task as Ray's working_dir (a local folder is only accepted
    for the whole job, at ray.init)."""
    import ray

    from pipeline.core import deps
    from pipeline.fleet import kinds
    from pipeline.serving.ray_node import own_ray

    common = {"log_to_driver": False, "logging_level": "ERROR"}
    if ship:
        common["runtime_env"] = {"working_dir": str(Path.cwd()), "excludes": SHIP_EXCLUDES}
    if not address or address == "local":  # a node of our own, on loopback (serving/ray_node.py)
        with own_ray(max(1, deps.cores()), resources={kinds.resource(kinds.here()): 1}, **common):
            yield "local"
        return
    try:
        ray.init(address=address, **common)
    except (ValueError, ConnectionError, TimeoutError) as e:  # what ray.init says of an address
        raise DependencyError(f"--address {address}: cannot join that Ray cluster "
                              f"({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})",
                              "check the head's address and that it runs (`ray status` on it)") from None
    try:
        yield address
    finally:
        ray.shutdown()


def _cluster_kinds() -> list[str]:
    import ray

    return kinds.kinds_of(ray.cluster_resources())


def _progress_view(all_jobs) -> object:
    from rich.table import Table

    counts = {state: sum(j.state == state for j in all_jobs) for state in _STATE_STYLE}
    t = Table(title="fleet: " + ", ".join(f"{n} {s}" for s, n in counts.items()), box=None)
    for col in ("job", "state", "node", "attempt"):
        t.add_column(col)
    for j in all_jobs:
        node = (j.started or {}).get("node_ip") or "-"
        tries = len(j.attempts) + (j.state in ("queued", "running"))
        t.add_row(j.pair, f"[{_STATE_STYLE[j.state]}]{j.state}[/]", node, str(tries))
    return t


def accepted_lines(engines_dir: Path, kind: str, recipe: str) -> list:
    from pipeline.artifacts import recorded
    from pipeline.store.recipe_folder import Store

    folder = jobs.destination(engines_dir, kind, recipe)
    return engine_lines(recorded.report(Store(folder.parent, folder.name).read_json("report.json")))


def build(names: list[str], everything: bool, address: str | None, wanted: list[str] | None,
          timeout_s: float | None, engines_dir: Path, overrides: tuple[str, ...] = (),
          fleet_cls=jobs.Fleet, on_event=None, ship: bool = False) -> FleetRun:
    """Run every (recipe, kind) pair; `ship`: send this folder (recipes, data, model code;
    not engines/ or .venv/) to the nodes as Ray's runtime_env working_dir, for nodes that
    do not have the checkout at this path."""
    from rich.live import Live

    from pipeline.core.ui import console, out
    from pipeline.store.recipe_folder import now

    refs = _recipes(names, everything, tuple(overrides))
    with connected(address, ship) as where:
        present = _cluster_kinds()
        chosen = wanted or present
        missing = [k for k in chosen if k not in present]
        if missing or not chosen:
            wanted_names = ", ".join(map(kinds.resource, missing)) or "a device kind"
            raise DependencyError(f"no node of the cluster advertises {wanted_names} "
                                  f"(advertised: {', '.join(present) or 'none'})",
                                  "start a node of that kind: `pipeline fleet node --address HEAD` "
                                  "on it prints its `ray start` line (docs/fleet.md)")
        with Live(console=console, transient=False, auto_refresh=False) as live:
            def show(all_jobs):
                live.update(_progress_view(all_jobs), refresh=True)

            fleet = fleet_cls(engines_dir, None if ship else str(Path.cwd()), timeout_s,
                              on_event=on_event, show=show)
            fleet.refs, fleet.overrides = refs, tuple(overrides)
            done = fleet.run([(recipe, kind) for recipe in refs for kind in chosen])
    pairs = []
    for job in done:
        lines = []
        if job.state == "done":
            try:
                lines = accepted_lines(engines_dir, job.kind, job.recipe)
            except IntegrityError as e:  # changed after it was accepted: not this run's result
                job.state = "failed"
                job.attempts[-1].reason = str(e)
        pairs.append(jobs.to_pair(job, engines_dir, lines))
    outcome = FleetRun(schema=1, created=now(), address=where, pairs=pairs)
    write(outcome, engines_dir / "fleet" / FILE)
    out.print(table(outcome))
    console.print(f"fleet: {engines_dir / 'fleet' / FILE}")
    return outcome


def write(outcome: FleetRun, path: Path) -> None:
    from pipeline.artifacts import recorded
    from pipeline.core.safe_files import write_atomic
    from pipeline.store.recipe_folder import dumps

    write_atomic(path, dumps(recorded.dump(outcome)))  # an exclusive, random temp name: no planted link


def read(path: Path) -> FleetRun:
    import json

    return FleetRun.model_validate(json.loads(path.read_text()))


def reports(engines_dir: Path, recipe: str) -> KindReports:
    """{kind: Report} of every kind the fleet accepted `recipe` for (each verified)."""
    from pipeline.artifacts import recorded
    from pipeline.core.errors import InputError
    from pipeline.store.recipe_folder import Store

    found = {}
    for folder in sorted((engines_dir / "fleet").glob(f"*/{recipe}")):
        if (folder / "report.json").is_file():
            store = Store(folder.parent, folder.name)
            found[folder.parent.name] = recorded.report(store.read_json("report.json"))
    if not found:
        raise InputError(f"no fleet build of {recipe} under {engines_dir / 'fleet'}",
                         f"run `pipeline fleet {recipe}` first")
    return found
