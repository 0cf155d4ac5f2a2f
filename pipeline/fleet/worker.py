"""What runs on a fleet node: one (recipe, device kind) pair, built by the ordinary `run`.

The task first checks that this node really is of the kind it advertised (a mislabeled
node would put a wrong engine under the kind's name), then runs `python -m pipeline run
RECIPE` in a private engines folder that is seeded with the folder the fleet accepted for
this kind before: the stage cache reuses every stage whose content key is recorded there
and verifies each file first. The run's subprocess dies with the worker (PR_SET_PDEATHSIG),
so a killed worker leaves nothing running (and the next job on the node removes its work
folder). What comes back: the packed folder (transfer.py) when the run finished (exit 0, or
3: a gate failed but the report is written), where it ran, which stages were reused and
which built, and the tail of the run's output.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.core import deps
from pipeline.core.errors import DependencyError, GateFailed
from pipeline.core.json_object import JsonObject
from pipeline.fleet import kinds, transfer

FINISHED = (0, GateFailed.exit_code)  # a run whose folder is a result (gates are verdicts)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # in the child, between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Tracker:
    """A Ray actor (jobs.py makes it one) the jobs tell when they start, so that the
    driver's progress shows `running` and where, and tests can act on a running job."""

    def __init__(self) -> None:
        self.log: list[dict] = []

    def started(self, event: dict) -> None:
        self.log.append(event)

    def since(self, index: int) -> list[dict]:
        return self.log[index:]


def _sweep_orphans() -> None:
    """Remove the work folders of jobs whose worker was killed (SIGKILL skips the cleanup of
    their TemporaryDirectory): `pipeline-fleet-<pid>-*` whose pid no longer runs."""
    for folder in Path(tempfile.gettempdir()).glob("pipeline-fleet-*-*"):
        pid = folder.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class PairResult:
    """What one attempt at a pair sends back to the driver: where it ran (node, pid, the
    kind the node really is, its device block), how it ended (`built` or `failed`, the run's
    exit code, why), the packed folder when built, the stages reused from the seed and those
    built, the tail of the run's output."""

    node_id: str
    node_ip: str
    pid: int
    kind_found: str
    device: JsonObject
    status: str = "failed"
    exit_code: int | None = None
    reason: str | None = None
    packed: transfer.Packed | None = None
    reused: list[str] = field(default_factory=list)
    built: list[str] = field(default_factory=list)
    log_tail: str = ""
    seconds: float | None = None


def _where() -> PairResult:
    """This node, before the attempt has done anything."""
    import ray

    return PairResult(node_id=ray.get_runtime_context().get_node_id(),
                      node_ip=ray.util.get_node_ip_address(), pid=os.getpid(),
                      kind_found=kinds.here(), device=deps.device())


def _tail(path: Path, chars: int = 3000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-chars:]


def _stage_stamps(packed: transfer.Packed | None) -> dict[str, tuple[str, str | None]]:
    if packed is None:
        return {}
    stages = json.loads(packed.manifest).get("stages", {})
    return {sid: (rec.get("key"), rec.get("finished")) for sid, rec in stages.items()}


def build_pair(job: dict, seed: transfer.Packed | None, tracker) -> PairResult:
    """Run one pair on this node. `job`: recipe (the engines folder's name), ref (the recipe
    as `pipeline run` takes it), overrides (--set values), kind, attempt, pair, project (the
    folder to run in; None: the task's working directory), timeout_s."""
    result = _where()
    tracker.started.remote({"pair": job["pair"], "attempt": job["attempt"], "time": time.time(),
                            "node_id": result.node_id, "node_ip": result.node_ip, "pid": result.pid})
    if result.kind_found != job["kind"]:
        return replace(result, exit_code=DependencyError.exit_code,
                       reason=f"node {result.node_ip} advertises {kinds.resource(job['kind'])} but "
                              f"its device is {result.kind_found} ({deps.device_line(result.device)})")
    t0 = time.perf_counter()
    _sweep_orphans()
    with tempfile.TemporaryDirectory(prefix=f"pipeline-fleet-{os.getpid()}-") as tmp:
        engines = Path(tmp) / "engines"
        folder = engines / job["recipe"]
        if seed is not None:
            transfer.unpack(seed, folder)
        env = {k: v for k, v in os.environ.items() if k != "PIPELINE_ENGINES"}
        log = Path(tmp) / "run.log"
        command = [sys.executable, "-m", "pipeline", "run", job.get("ref") or job["recipe"],
                   "--engines-dir", str(engines)]
        for value in job.get("overrides") or ():
            command += ["--set", value]
        try:
            with open(log, "wb") as out:
                code = subprocess.run(command, cwd=job["project"] or os.getcwd(), env=env,
                                      stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      preexec_fn=_die_with_parent, timeout=job["timeout_s"]).returncode
        except subprocess.TimeoutExpired:
            return replace(result, exit_code=4, log_tail=_tail(log),
                           reason=f"`pipeline run {job['recipe']}` ran past {job['timeout_s']} s")
        result = replace(result, exit_code=code, log_tail=_tail(log), seconds=time.perf_counter() - t0)
        if code not in FINISHED:
            last = [line for line in result.log_tail.splitlines() if line.strip()]
            return replace(result, reason=f"`pipeline run {job['recipe']}` exited {code}: "
                                          f"{last[-1] if last else 'no output'}")
        packed = transfer.pack(folder)
    before, after = _stage_stamps(seed), _stage_stamps(packed)
    reused = sorted(sid for sid, stamp in after.items() if before.get(sid) == stamp)
    return replace(result, status="built", packed=packed, reused=reused,
                   built=sorted(set(after) - set(reused)))
