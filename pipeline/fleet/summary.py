"""fleet.json (typed like pipeline/artifacts/*) and the tables people read.

    FleetRun { schema: 1, created, address, pairs: [Pair] }
    Pair { recipe, kind, status: done | failed, exit_code, folder | null, reason | null,
           attempts: [Attempt], engines: [{target, status, precision, p50_ms, speedup,
           ci95, verdict, gates: [Gate]}], reused: [stage id], built: [stage id] }
    Attempt { number, node_id, node_ip, kind_found, outcome: accepted | failed | refused |
              lost, exit_code, reason, seconds }

A pair is `done` when a folder came back whole and verified (its run exited 0, or 3 when a
gate failed: exit_code says which); `failed` when no attempt gave one. The fleet's exit code
is the worst pair's (the highest of core/errors.py's codes).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.artifacts.base import Closed, Count
from pipeline.artifacts.report import Gate, Interval, Report
from pipeline.core.text import fmt, speedup

SCHEMA = 1
FILE = "fleet.json"


class Attempt(Closed):
    number: int = Field(ge=1)
    node_id: str | None = Field(None, description="The Ray node it ran on (None: never started).")
    node_ip: str | None = None
    kind_found: str | None = Field(None, description="The device kind the node found it had.")
    outcome: Literal["accepted", "failed", "refused", "lost"] = Field(
        description="accepted: verified and stored; failed: the run did not finish; refused: "
                    "what came back did not match its manifest; lost: the worker or node died.")
    exit_code: int | None = None
    reason: str | None = None
    seconds: float | None = None


class EngineLine(Closed):
    target: str
    status: str
    precision: str | None = None
    p50_ms: float | None = None
    speedup: float | None = Field(None, description="Baseline time / engine time.")
    ci95: Interval | None = None
    verdict: str | None = None
    gates: list[Gate] = []


class Pair(Closed):
    recipe: str
    kind: str = Field(description="The device kind, e.g. cpu-avx512_vnni or gpu-nvidia-h200.")
    status: Literal["done", "failed"]
    exit_code: Count
    folder: str | None = Field(None, description="Where it was accepted, e.g. engines/fleet/<kind>/<recipe>.")
    reason: str | None = None
    attempts: list[Attempt] = []
    engines: list[EngineLine] = []
    reused: list[str] = Field([], description="Stages the cache reused from the seeded folder.")
    built: list[str] = Field([], description="Stages this run built.")


class FleetRun(Closed):
    schema_: Literal[1] = Field(SCHEMA, alias="schema")
    created: str
    address: str = Field(description="The Ray cluster (`local`: started by the command).")
    pairs: list[Pair] = []

    @property
    def exit_code(self) -> int:
        return max((p.exit_code for p in self.pairs), default=0)


def engine_lines(report: Report) -> list[EngineLine]:
    lines = []
    for e in report.engines:
        s = e.speedup_vs_baseline
        lines.append(EngineLine(
            target=e.target, status=e.status, precision=e.precision,
            p50_ms=e.latency_ms.p50 if e.latency_ms else None,
            speedup=s.ratio if s else None, ci95=list(s.ci95) if s else None,
            verdict=s.verdict if s else None, gates=list(e.gates or [])))
    return lines


def _gates(line: EngineLine) -> str:
    if not line.gates:
        return "-"
    failed = [g.name for g in line.gates if not g.passed]
    return f"FAILED {', '.join(failed)}" if failed else f"{len(line.gates)} passed"


def table(run: FleetRun):
    """Every pair: where it ran, attempts, each engine's verdict and gates."""
    from rich.table import Table

    t = Table(title=f"fleet ({run.address}): {len(run.pairs)} jobs, exit {run.exit_code}")
    for col in ("recipe", "kind", "status", "node", "attempts", "stages", "target", "p50 ms",
                "vs PyTorch", "gates"):
        t.add_column(col)
    for p in run.pairs:
        last = p.attempts[-1] if p.attempts else None
        node = f"{last.node_ip} {last.node_id[:8]}" if last and last.node_id else "-"
        tries = "; ".join(f"{a.number}:{a.outcome}" for a in p.attempts) or "-"
        stages = f"{len(p.built)} built, {len(p.reused)} reused" if p.status == "done" else "-"
        head = (p.recipe, p.kind, f"{p.status} ({p.exit_code})", node, tries, stages)
        if not p.engines:
            t.add_row(*head, "-", "-", p.reason or "-", "-")
        for i, e in enumerate(p.engines):
            row = head if i == 0 else ("",) * len(head)
            t.add_row(*row, e.target, fmt(e.p50_ms), _verdict(e), _gates(e))
    return t


def _verdict(e: EngineLine) -> str:
    if e.speedup is None:
        return e.status
    return f"{speedup(e.speedup, e.ci95)} ({e.verdict})"


def compare_table(recipe: str, reports: dict[str, Report]):
    """One recipe across device kinds: each target's time and verdict per kind, side by side."""
    from rich.table import Table

    from pipeline.core import deps

    t = Table(title=f"{recipe} across device kinds")
    for col in ("target", "kind", "device", "precision", "p50 ms", "vs PyTorch", "gates"):
        t.add_column(col)
    targets = sorted({e.target for r in reports.values() for e in r.engines})
    for target in targets:
        for kind, report in sorted(reports.items()):
            for e in engine_lines(report):
                if e.target == target:
                    t.add_row(target, kind, deps.device_line(report.device.model_dump()),
                              e.precision or "-", fmt(e.p50_ms), _verdict(e), _gates(e))
    return t
