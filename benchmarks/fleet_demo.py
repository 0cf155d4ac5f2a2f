"""A two-node local Ray cluster builds three recipes for two device kinds, with one worker killed.

    PYTHONPATH=. nice python benchmarks/fleet_demo.py [--recipes standard,standard-int8,minilm-int8]
                                                      [--kill RECIPE] [--out benchmarks/results]

Node 1 (the head) advertises this machine's device kind; node 2 advertises another CPU kind,
simulated: its raylet's environment sets PIPELINE_DEVICE_OVERRIDE, so its workers' runs
really see that instruction set (the precision stage picks its INT8 weight range for it, the
reports record it), though both nodes are this one machine and time on the same cores.
Every (recipe, kind) pair runs the ordinary `pipeline run` on a node of its kind
(validate.threads=1: the two nodes share 2 cores). While the `--kill` recipe is building on
node 2, that node's worker is SIGKILLed once its `pipeline run` has been running 20 s: the
job is reported lost and retried (on node 2 again: it is the only node of its kind), the
other jobs go on. Writes fleet-demo-<date>.md (the summary, the cross-kind tables, the
events) and fleet-demo-<date>.json (fleet.json) to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console

from pipeline.core import deps
from pipeline.fleet import kinds, run
from pipeline.fleet.summary import compare_table, table
from tests.fleet.test_cluster import _children  # a process's children, from /proc

ROOT = Path(__file__).resolve().parent.parent


def _killer(target: str, after_s: float, log: list[str]):
    """An on_event callback: when `target`'s first attempt starts, a thread waits until the
    worker's `pipeline run` child has run `after_s`, then SIGKILLs the worker."""
    def watch(event):
        deadline = time.monotonic() + 600
        child_seen = None
        while time.monotonic() < deadline:
            if _children(event["pid"]):
                child_seen = child_seen or time.monotonic()
                if time.monotonic() - child_seen >= after_s:
                    os.kill(event["pid"], signal.SIGKILL)
                    log.append(f"{time.strftime('%H:%M:%S')} killed worker pid {event['pid']} on node "
                               f"{event['node_id'][:8]} while {event['pair']} was building "
                               f"(its `pipeline run` had run {after_s:.0f} s)")
                    return
            time.sleep(0.5)

    def on_event(event):
        log.append(f"{time.strftime('%H:%M:%S')} {event['pair']} attempt {event['attempt']} running on "
                   f"node {event['node_id'][:8]}")
        pair = event["pair"]
        if pair.startswith(f"{target}@") and pair.endswith(f"@{KIND_B}") and event["attempt"] == 1:
            threading.Thread(target=watch, args=(event,), daemon=True).start()
    return on_event


KIND_A = kinds.here()
KIND_B = "cpu-avx2" if KIND_A != "cpu-avx2" else "cpu-avx512_vnni"
DEVICE_B = {"cpu_isa": ["avx2"]} if KIND_B == "cpu-avx2" else {"cpu_isa": ["avx2", "avx512f", "avx512_vnni"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default="standard,standard-int8,minilm-int8")
    parser.add_argument("--kill", default="minilm-int8", help="The recipe whose kind-B job is killed once.")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    from ray.cluster_utils import Cluster

    ray_tmp = tempfile.mkdtemp(prefix="rayd", dir="/tmp")  # short: Ray's unix sockets
    os.environ["RAY_TMPDIR"] = ray_tmp  # our own session files; another Ray is never touched
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "180")  # a loaded machine
    project = Path(tempfile.mkdtemp(prefix="fleet-demo-"))
    shutil.copytree(ROOT / "recipes", project / "recipes")
    shutil.copytree(ROOT / "data", project / "data", ignore=shutil.ignore_patterns("train.txt"))
    events: list[str] = []
    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "object_store_memory": 1 << 30,
        "resources": {kinds.resource(KIND_A): 1}})
    try:
        node_b = cluster.add_node(num_cpus=1, object_store_memory=1 << 30,
                                  resources={kinds.resource(KIND_B): 1},
                                  env_vars={deps.DEVICE_OVERRIDE: json.dumps(DEVICE_B)})
        cluster.wait_for_nodes(timeout=180)
        nodes = {cluster.head_node.node_id: KIND_A, node_b.node_id: KIND_B}
        events.append(f"cluster up in {time.perf_counter() - t0:.0f} s: node {cluster.head_node.node_id[:8]} "
                      f"advertises {kinds.resource(KIND_A)}, node {node_b.node_id[:8]} {kinds.resource(KIND_B)}")
        with contextlib.chdir(project):
            outcome = run.build(args.recipes.split(","), False, cluster.address, [KIND_A, KIND_B], None,
                                Path("engines"), ("validate.threads=1",),
                                on_event=_killer(args.kill, 20.0, events))
            reports = {p.recipe: run.reports(Path("engines"), p.recipe) for p in outcome.pairs
                       if p.status == "done"}
    finally:
        cluster.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    wall = time.perf_counter() - t0
    placed = all(nodes.get(p.attempts[-1].node_id) == p.kind for p in outcome.pairs if p.attempts)

    text = io.StringIO()
    console = Console(file=text, width=170, record=False)
    console.print(table(outcome))
    for recipe, by_kind in reports.items():
        console.print(compare_table(recipe, by_kind))
    stamp = datetime.date.today().isoformat()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"fleet-demo-{stamp}.json").write_text(
        (project / "engines" / "fleet" / "fleet.json").read_text())
    lines = [f"# Fleet demo, {stamp}", "",
             f"`PYTHONPATH=. nice python benchmarks/fleet_demo.py` on {deps.device_line(deps.device())}: "
             f"a two-node local Ray cluster (ray.cluster_utils), node 1 of kind `{KIND_A}` (this "
             f"machine), node 2 of kind `{KIND_B}` (simulated: PIPELINE_DEVICE_OVERRIDE="
             f"{json.dumps(DEVICE_B)} in its raylet's environment; same cores). Recipes "
             f"{args.recipes} with `--set validate.threads=1`. Wall time {wall:.0f} s; exit code "
             f"{outcome.exit_code}; every job on a node of its kind: {placed}.", "",
             "Timings: both nodes are one 2-core machine running two jobs at once beside other "
             "work: compare the verdicts, not absolute times, and not kind against kind.", "",
             "## Events", "", *[f"- {e}" for e in events], "", "## Summary and cross-kind tables",
             "", "```", text.getvalue().rstrip(), "```", ""]
    (args.out / f"fleet-demo-{stamp}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    shutil.rmtree(project, ignore_errors=True)


if __name__ == "__main__":
    main()
