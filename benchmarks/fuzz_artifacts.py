"""The artifact fuzz of tests/artifacts/test_fuzz.py, run longer: many damaged files read in
process, a number of damaged folders through the real CLI, and `run --force` on a folder with
every artifact damaged. Writes benchmarks/results/fuzz-artifacts-<date>.{json,md}.

    python benchmarks/fuzz_artifacts.py --count 5000 --cli 20

In process, each example damages the bytes of one artifact (report.json, manifest.json,
validate-<target>.json, versus-*.json, baseline.npz: truncated, spliced, nested 100,000 deep,
a 5,000-digit integer, NaN, noise) and reads it through the command's reader: it must read
or refuse in one line (any other exception is a failure). Through the CLI, each example
re-signs a damaged report/validate record (or damages the manifest) in a copy of a built
folder and runs verify, deploy and run: the exit code must be documented (0, 2, 3, 4, 5),
a failure one `Error:` line with no traceback, and a canary tree outside unchanged.
Failures are counted, not raised, so one run reports them all.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.artifacts.test_fuzz import (  # noqa: E402
    JSON_ARTIFACTS,
    VERSUS,
    _canary,
    cli_problems,
    damage_every_artifact,
    damaged_bytes,
    damaged_project,
    read_planted,
)
from tests.conftest import FAST, STANDARD, Project  # noqa: E402


def in_process(folder: Path, count: int, seed: int) -> dict:
    raw = {n: (folder / n).read_bytes() for n in JSON_ARTIFACTS[:3] + ("baseline.npz",)}
    raw["versus-onnxruntime-other.json"] = json.dumps(VERSUS).encode()
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-")) / "engines" / "x"
    scratch.mkdir(parents=True)
    failures: list[str] = []
    seen = {"examples": 0}

    @settings(max_examples=count, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def one(data):
        name = data.draw(st.sampled_from(sorted(raw)))
        damaged = data.draw(damaged_bytes(raw[name]))
        (scratch / name).write_bytes(damaged)
        seen["examples"] += 1
        try:
            read_planted(scratch / name)
        except Exception:  # noqa: BLE001 - counted: any exception but a one-line refusal
            failures.append(f"{name} ({len(damaged)} bytes): {traceback.format_exc(limit=2)[-300:]}")

    t0 = time.perf_counter()
    one()
    return {"examples": seen["examples"], "seconds": round(time.perf_counter() - t0, 1),
            "failures": len(failures), "failure_samples": failures[:5]}


def through_cli(built: Path, count: int) -> dict:
    failures: list[str] = []
    seen = {"examples": 0}
    originals = {n: (built / STANDARD / n).read_bytes()
                 for n in ("report.json", "validate-onnxruntime.json", "manifest.json")}

    @settings(max_examples=count, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def one(data):
        name = data.draw(st.sampled_from(sorted(originals)))
        damaged = data.draw(damaged_bytes(originals[name]))
        seen["examples"] += 1
        root = Path(tempfile.mkdtemp(prefix="fuzzcli-"))
        proj, canary, before = damaged_project(root, built, name, damaged)
        failures.extend(cli_problems(proj, name, timeout=600))
        if _canary(canary) != before:
            failures.append(f"{name}: the canary changed")
        shutil.rmtree(root, ignore_errors=True)

    t0 = time.perf_counter()
    one()
    return {"examples": seen["examples"], "commands": 3 * seen["examples"], "seconds": round(time.perf_counter() - t0, 1),
            "failures": len(failures), "failure_samples": failures[:5]}


def force_clears(built: Path) -> dict:
    """Every artifact damaged at once, then `run --force`: it must rebuild and verify."""
    proj = Project(Path(tempfile.mkdtemp(prefix="fuzzforce-")) / "proj")
    shutil.copytree(built, proj.engines)
    damage_every_artifact(proj.engines / STANDARD)
    t0 = time.perf_counter()
    stuck, forced = proj.run("run", "standard", *FAST), proj.run("run", "standard", "--force", *FAST)
    verified = proj.run("verify", f"engines/{STANDARD}", "--files-only")
    return {"stuck_exit": stuck.code, "force_exit": forced.code, "verify_exit": verified.code,
            "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=5000, help="in-process examples")
    ap.add_argument("--cli", type=int, default=20, help="damaged folders through the CLI")
    ap.add_argument("--engines", type=Path, default=None,
                    help=f"a built engines/ folder holding {STANDARD} (else one is built)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    built = args.engines
    if built is None:
        proj = Project(Path(tempfile.mkdtemp(prefix="fuzzbuild-")) / "proj")
        r = proj.run("run", "standard", *FAST)
        assert r.code == 0, r.err
        built = proj.engines
    result = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "in_process": in_process(built / STANDARD, args.count, args.seed),
              "cli": through_cli(built, args.cli), "force": force_clears(built)}
    out = ROOT / "benchmarks" / "results" / f"fuzz-artifacts-{result['date'][:10]}"
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    ip, cli, force = result["in_process"], result["cli"], result["force"]
    out.with_suffix(".md").write_text(
        f"# Artifact fuzz, {result['date']}\n\n`python benchmarks/fuzz_artifacts.py --count "
        f"{args.count} --cli {args.cli}` on 2 shared cores.\n\n"
        f"| part | examples | seconds | failures |\n|---|---|---|---|\n"
        f"| in process (read or refuse in one line) | {ip['examples']} | {ip['seconds']} | {ip['failures']} |\n"
        f"| CLI: verify, deploy, run on a re-signed damaged folder | {cli['examples']} ({cli['commands']} commands) "
        f"| {cli['seconds']} | {cli['failures']} |\n"
        f"| every artifact damaged: run (exit {force['stuck_exit']}), run --force (exit "
        f"{force['force_exit']}), verify (exit {force['verify_exit']}) | 1 | {force['seconds']} | "
        f"{int(force['force_exit'] != 0 or force['verify_exit'] != 0)} |\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
