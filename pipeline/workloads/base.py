"""The Workload contract: what one request is, and everything that depends on it.

A workload is a pair of modules (typing.Protocol over module attributes, as for backends),
picked once from the recipe's `workload.kind` by the registry (pipeline/workloads):

the workload (stages: baseline, validate, report)
    KIND          the recipe's `workload.kind` it serves ("forward", "generation", ...)
    BASELINE      the name of its PyTorch baseline runner in timings and reports
    baseline(recipe, workdir) -> ({file: path}, meta)          the baseline stage's work
    measure(recipe, target, engine, baseline, workdir) -> Measured
                  one engine against the baseline; stages/validate.py turns it into the
                  EngineResult (the one place one is built) and adds the accuracy gates
    engine_markdown(entry) -> [line]   report.md's workload section of one built engine
    headlines(report) -> [line]        what the terminal table's caption and report.md show
                                       first, one line per built engine ([] when the table says it)
    roofline_points(recipe, context=None) -> roofline.points.Points
                  the shapes the roofline floors (`pipeline predict`) and each build profiles
                  (the report's roofline section), marked `profiled`; the roofline takes the
                  workload (roofline.points.PointSource) and never tests its kind

its comparer (the `pipeline compare` command; no stage's cache key holds its code)
    check_comparable(recipes)          before anything is built: exit 2 when they are not
    compare(recipes, reports, root, progress) -> Compared

What the graph looks like (a KV cache around the model, or the model alone) is the recipe's
to say (recipe/workload.py: `WorkloadSpec.kv_cache`), since export and the model checks run
before, and without, any workload code. A third workload (serving) is a module pair keeping
this contract plus one line in each of workloads.BUILTIN and workloads.COMPARERS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import Field

from pipeline.artifacts.base import Closed, FileName
from pipeline.artifacts.generation import Generation
from pipeline.artifacts.latency import ColdStart, LatencySummary, Speedup
from pipeline.artifacts.report import (
    CudaGraphSpeedup,
    HarnessOverhead,
    OutputAccuracy,
    Resources,
    SweepPoint,
    TaskMetric,
)
from pipeline.core.errors import DependencyError

if TYPE_CHECKING:
    from pipeline.roofline.points import Points

EntriesByTarget = dict[str, dict]  # target id -> its engine entry in report.json
FieldValues = dict[str, Any]  # EngineResult field name -> its value


class Measurement(Closed):
    """What a workload measured of one engine: the EngineResult fields of the same names,
    typed as there (stages/validate.py adds what identifies the engine, the precision checks
    and the gates). What `latency_ms` and `baseline_latency_ms` time is the workload's: a
    request (forward), a decode step at batch 1 (generation). The fields a workload sets,
    None included, are the ones its EngineResult writes."""

    accuracy: dict[str, OutputAccuracy]
    latency_ms: LatencySummary
    baseline_latency_ms: LatencySummary
    speedup_vs_baseline: Speedup
    latency_method: str
    threads: int | None
    device: str
    resources: Resources | None = None
    warnings: list[str] = []
    task: TaskMetric | None = None
    cold_start_ms: ColdStart | None = None
    baseline_cold_start_ms: ColdStart | None = None
    sweep: list[SweepPoint] = []
    timer: str | None = None
    stop: str | None = None
    harness_overhead_us: HarnessOverhead | None = None
    plot: FileName | None = None
    speedup_vs_cudagraph: CudaGraphSpeedup | None = None
    runtime: dict[str, Any] | None = Field(None, description="A backend's (validation_extras).")
    tensorrt_layer_shares: dict[str, Any] | None = Field(None, description="A backend's (validation_extras).")
    generation: Generation | None = None

    def fields(self) -> FieldValues:
        """The fields set, by name, as the EngineResult takes them (typed, not dumped)."""
        return {name: getattr(self, name) for name in self.model_fields_set}


@dataclass
class Measured:
    """One engine measured by a workload: its Measurement, the gates only the workload can
    judge (Gate: a backend's own), and files written beside validate-<target>.json.
    `skipped`: why it was not measured (the engine was built)."""

    measurement: Measurement | None = None
    gates: list = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)
    skipped: str | None = None


@dataclass
class Compared:
    """What `pipeline compare` made: the result (a pydantic model, artifacts/comparison.py),
    what the terminal prints (rich renderables or lines) and the files a person opens."""

    result: Any
    folder: Path
    printed: list = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


class Workload(Protocol):
    KIND: str
    BASELINE: str

    def baseline(self, recipe, workdir: Path) -> tuple[dict[str, Path], dict]: ...

    def measure(self, recipe, target, engine, baseline, workdir: Path) -> Measured: ...

    def engine_markdown(self, entry: dict) -> list[str]: ...

    def headlines(self, report: dict) -> list[str]: ...

    def roofline_points(self, recipe, context: int | None = None) -> Points: ...


class Comparer(Protocol):
    def check_comparable(self, recipes: list) -> None: ...

    def compare(self, recipes: list, reports: dict, root: Path, progress) -> Compared: ...


WORKLOAD_NEEDS = ("KIND", "BASELINE", "baseline", "measure", "engine_markdown", "headlines", "roofline_points")
COMPARER_NEEDS = ("check_comparable", "compare")


def check(kind: str, module: Any, needs: tuple[str, ...] = WORKLOAD_NEEDS) -> Any:
    """`module` if it keeps its part of the contract for `kind`, else one error naming what
    it lacks."""
    missing = [name for name in needs if not hasattr(module, name)]
    name = getattr(module, "__name__", repr(module))
    if missing:
        raise DependencyError(f"workload `{kind}` ({name}) lacks {', '.join(missing)} "
                              "(see the Workload contract in pipeline/workloads/base.py)")
    if "KIND" in needs and module.KIND != kind:
        raise DependencyError(f"workload `{kind}` ({name}) declares KIND {module.KIND!r}")
    return module


def built(report: dict) -> EntriesByTarget:
    """A report's built engines by target id, in the recipe's order."""
    return {e["target"]: e for e in report["engines"] if e["status"] == "built"}


def shared_targets(recipes: list, reports: dict[str, dict], accept=lambda entry: True) -> list[str]:
    """Target ids every recipe built (and `accept`s), in the first recipe's order: the
    engines `pipeline compare` times against each other."""
    first = built(reports[recipes[0].name])
    return [t for t, e in first.items() if accept(e) and all(
        t in built(reports[r.name]) and accept(built(reports[r.name])[t]) for r in recipes[1:])]


def compare_folder(root: Path, recipes: list) -> Path:
    """engines/compare/<A>-vs-<B>...: where a comparison's files go."""
    from pipeline.core import safe_files

    # a real folder, never a link (a planted link would carry the writes elsewhere)
    return safe_files.folder(root, "compare", "-vs-".join(r.name for r in recipes))
