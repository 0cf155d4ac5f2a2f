"""The fleet's driver: one Ray task per (recipe, device kind) pair, retried once elsewhere.

Each pair is submitted with the Ray resource of its kind (`device:<kind>`: only a node of
that kind can take it) and the engine folder already accepted for it as a seed (so the
stage cache on whichever node runs it reuses what any node built for the kind before). A
pair whose attempt fails (the run exits with an error, the worker is killed, the node is
lost, or what comes back does not verify) is retried once, pinned to another alive node
that advertises the kind when there is one; the other pairs go on. A result is accepted
only whole and verified (transfer.accept). Progress shows every pair queued, running, done
or failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import IntegrityError, PipelineError, StageFailed
from pipeline.core.text import first_line
from pipeline.fleet import kinds, transfer, worker
from pipeline.fleet.summary import Attempt, Pair

ATTEMPTS = 2  # the first try, and one retry on another node of the same kind
LOST = StageFailed.exit_code  # a job whose worker or node died never finished its stages


@dataclass
class _Job:
    recipe: str  # the engines folder's name: the recipe's, @<digest> with --set values
    kind: str
    state: str = "queued"  # queued | running | done | failed
    attempts: list[Attempt] = field(default_factory=list)
    failed_nodes: set[str] = field(default_factory=set)
    ref: object = None
    started: dict | None = None  # the tracker's event for the attempt now running
    result: worker.PairResult | None = None  # the accepted attempt's

    @property
    def pair(self) -> str:
        return f"{self.recipe}@{self.kind}"


def destination(engines_dir: Path, kind: str, recipe: str) -> Path:
    """Where a pair's accepted folder lives: engines/fleet/<kind>/<recipe>/."""
    return engines_dir / "fleet" / kind / recipe


class Fleet:
    """Runs pairs on the connected Ray cluster and accepts their folders into `engines_dir`."""

    def __init__(self, engines_dir: Path, project: str | None, timeout_s: float | None = None,
                 on_event: Callable[[dict], None] | None = None, show: Callable | None = None):
        self.engines_dir = engines_dir
        self.project = project  # where nodes run `pipeline run` (None: the task's cwd)
        self.refs: dict[str, str] = {}  # folder name -> how to name its recipe to `pipeline run`
        self.overrides: tuple[str, ...] = ()  # --set values for every recipe
        self.timeout_s = timeout_s
        self.on_event = on_event or (lambda event: None)  # tests act on a running job
        self.show = show or (lambda jobs: None)

    # ------------------------------------------------------------------ Ray plumbing
    def _alive_nodes(self, kind: str) -> list[str]:
        import ray

        return sorted(n["NodeID"] for n in ray.nodes()
                      if n["Alive"] and n["Resources"].get(kinds.resource(kind), 0) >= 1)

    def _submit(self, job: _Job) -> str | None:
        """Start the job's next attempt; None, or why it cannot be placed."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = self._alive_nodes(job.kind)
        if not nodes:
            return f"no alive node advertises {kinds.resource(job.kind)}"
        options = {"resources": {kinds.resource(job.kind): 1}, "max_retries": 0,
                   "num_cpus": 1, "num_gpus": 1 if job.kind.startswith("gpu-") else 0}
        others = [n for n in nodes if n not in job.failed_nodes]
        if job.failed_nodes and others:  # the retry goes elsewhere when there is an elsewhere
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(others[0], soft=False)
        seed = self._seed(job)
        spec = {"recipe": job.recipe, "ref": self.refs.get(job.recipe),
                "overrides": list(self.overrides), "kind": job.kind, "pair": job.pair,
                "project": self.project, "attempt": len(job.attempts) + 1,
                "timeout_s": self.timeout_s}
        job.ref = self._task.options(**options).remote(spec, seed, self._tracker)
        job.state, job.started = "queued", None
        return None

    def _seed(self, job: _Job):
        """The folder accepted for this pair before, packed (None: none, or it no longer
        verifies: a seed must never carry a changed file into the cache)."""
        import ray

        folder = destination(self.engines_dir, job.kind, job.recipe)
        if not (folder / "manifest.json").is_file():
            return None
        try:
            packed = transfer.pack(folder)
            transfer.check(packed, str(folder))
        except (PipelineError, OSError):
            return None
        return ray.put(packed)

    # ------------------------------------------------------------------ outcomes
    def receive(self, job: _Job, result: worker.PairResult) -> worker.PairResult:
        """What came back from a job, as the driver sees it (tests corrupt it here)."""
        return result

    def _attempt(self, job: _Job, outcome: str, **fields) -> None:
        where = job.started or {}
        job.attempts.append(Attempt(number=len(job.attempts) + 1, node_id=where.get("node_id"),
                                    node_ip=where.get("node_ip"), outcome=outcome, **fields))
        if outcome != "accepted" and where.get("node_id"):
            job.failed_nodes.add(where["node_id"])

    def _finish(self, job: _Job) -> None:
        """Take the job's attempt that ended: accept it, or record why not and retry."""
        import ray

        try:
            result = self.receive(job, ray.get(job.ref))
        except ray.exceptions.RayTaskError as e:
            self._attempt(job, "failed", exit_code=StageFailed.exit_code,
                          reason=first_line(e.cause if e.cause else e, with_type=True))
        except ray.exceptions.RayError as e:  # worker killed, node lost, object lost
            self._attempt(job, "lost", exit_code=LOST, reason=first_line(e, with_type=True))
        else:
            job.started = job.started or {"node_id": result.node_id, "node_ip": result.node_ip}
            fields = {"kind_found": result.kind_found, "exit_code": result.exit_code,
                      "seconds": result.seconds}
            if result.status != "built":
                self._attempt(job, "failed", reason=result.reason, **fields)
            else:
                try:
                    transfer.accept(result.packed, destination(self.engines_dir, job.kind,
                                    job.recipe), f"{job.pair} from {job.started.get('node_ip')}")
                except (IntegrityError, OSError) as e:
                    self._attempt(job, "refused", reason=first_line(e), **{**fields, "exit_code":
                                  IntegrityError.exit_code})
                else:
                    self._attempt(job, "accepted", **fields)
                    job.state, job.result = "done", result
                    return
        self._retry(job)

    def _retry(self, job: _Job) -> None:
        if len(job.attempts) < ATTEMPTS:
            why = self._submit(job)
            if why is None:
                return
            job.attempts[-1].reason = f"{job.attempts[-1].reason}; no retry: {why}"
        job.state, job.ref = "failed", None

    # ------------------------------------------------------------------ the loop
    def run(self, pairs: list[tuple[str, str]]) -> list[_Job]:
        import ray

        self._task = ray.remote(worker.build_pair)
        # the tracker lives on this (the driver's) node: placed anywhere, it can land on a
        # worker node that is then lost, and every job's progress dies with it
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._tracker = ray.remote(num_cpus=0)(worker.Tracker).options(scheduling_strategy=here).remote()
        jobs = [_Job(recipe, kind) for recipe, kind in pairs]
        for job in jobs:
            why = self._submit(job)
            if why is not None:
                job.attempts.append(Attempt(number=1, outcome="failed", reason=why,
                                            exit_code=StageFailed.exit_code))
                job.state = "failed"
        seen = 0
        while active := {j.ref: j for j in jobs if j.ref is not None and j.state in ("queued", "running")}:
            ready, _ = ray.wait(list(active), num_returns=1, timeout=0.5)
            events = ray.get(self._tracker.since.remote(seen))
            seen += len(events)
            for event in events:
                job = next(j for j in jobs if j.pair == event["pair"])
                if event["attempt"] == len(job.attempts) + 1 and job.state == "queued":
                    job.state, job.started = "running", event
                    self.show(jobs)
                    self.on_event(event)
            for ref in ready:
                self._finish(active[ref])
            self.show(jobs)
        return jobs


def to_pair(job: _Job, engines_dir: Path, lines) -> Pair:
    """A finished job as fleet.json's Pair (`lines`: the accepted report's engine lines)."""
    result = job.result
    last = job.attempts[-1] if job.attempts else None
    folder = destination(engines_dir, job.kind, job.recipe)
    done = job.state == "done"
    code = last.exit_code if last and last.exit_code is not None else StageFailed.exit_code
    return Pair(recipe=job.recipe, kind=job.kind, status="done" if done else "failed",
                exit_code=code if done or code else StageFailed.exit_code,
                folder=str(folder) if done else None, reason=None if done else (last and last.reason),
                attempts=job.attempts, engines=lines if done else [],
                reused=result.reused if result else [], built=result.built if result else [])
