"""The load test's artifact in the recipe's folder, and its section of report.md.

load-<engine>[-<name>].json (artifacts.serving.LoadResult) and its PNG are committed through
the store like a stage's files (stage id `load:<stem>`, by run/records.py: temp file,
manifest `pending`, rename, record), so `pipeline verify` checks them and a later reader gets
exactly what was written. report.md is rendered from report.json plus every recorded load
file: the report stage takes the load files as inputs (a new load result reruns it), and
`pipeline load` re-renders report.md at once when the folder already has a report.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pipeline.artifacts import dump
from pipeline.artifacts.serving import LoadResult, file_name
from pipeline.run import records


def is_load_file(name: str) -> bool:
    return name.startswith("load-") and name.endswith(".json")


def write(model: LoadResult, plot: Path | None, store, workload=None) -> Path:
    """Commit `model` (and `plot`) into the store's folder, the one place it is dumped;
    returns the JSON path. workload: the recipe's (workloads.of), for report.md's engine
    sections."""
    name = file_name(model.engine, model.name)
    stem = name[:-len(".json")]
    with store.lock():
        work = store.workdir(f"load-{stem}")
        produced = {}
        if plot is not None:
            produced[f"{stem}.png"] = work / f"{stem}.png"
            shutil.copyfile(plot, produced[f"{stem}.png"])
            model = model.model_copy(update={"plot": f"{stem}.png"})
        result = dump(model)
        produced[name] = work / name
        produced[name].write_text(json.dumps(result, indent=2) + "\n")
        # a measurement, never a cache hit: its key is what it measured
        key = records.stage_key(f"load:{stem}", result, {})
        records.commit(store, f"load:{stem}", produced, key, stamped=False)
        _rerender_report(store, workload)
    return store.dir / name


def recorded_loads(store) -> list[dict]:
    """Every load file the folder records, verified and parsed."""
    return [store.read_json(n) for n in store.file_names() if is_load_file(n)]


def _rerender_report(store, workload=None) -> None:
    """report.md again with the Serving section, when the folder has a report (its report.json
    unchanged); the report stage's record stays, so a later run keeps using it."""
    from pipeline.render.report_markdown import markdown  # with the Serving section

    record = store.stage_record("report")
    if record is None or "report.md" not in record.outputs or "report.json" not in store.file_names():
        return
    report = store.read_json("report.json")
    md = store.workdir("report-serving") / "report.md"
    md.write_text(markdown(report, workload, recorded_loads(store)))
    records.recommit(store, "report", {"report.md": md})
