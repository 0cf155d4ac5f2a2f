"""`pipeline load` into a built recipe's folder: the load file is committed through the
store (the manifest records it, `pipeline verify` passes), report.md gains its Serving
section at once, and a later `pipeline report` (whose report stage now takes the load file
as an input) keeps it. A real `pipeline run digits` and real subprocesses; the server is the
stdlib stand-in of tests/loadgen_server.py."""

from __future__ import annotations

import json

import pytest

from tests.conftest import FAST
from tests.loadgen_server import Behaviour, FakeServer

pytestmark = pytest.mark.slow


def test_load_results_land_in_report_md(project):
    built = project.run("run", "digits", *FAST)
    assert built.code == 0, built.err
    folder = project.folder(built)
    with FakeServer(Behaviour(service=0.002), model="digits") as server:
        loaded = project.run("load", folder.name, "--url", server.url, "--sweep", "20,40",
                             "--duration", "1", "--warmup", "0.2", "--min-requests", "30",
                             "--slo", "p99=200ms", timeout=180)
    assert loaded.code == 0, loaded.err
    report = (folder / "report.md").read_text()
    assert "## Serving" in report and "![sweep](load-onnxruntime.png)" in report
    assert report.count("| 20.00 |") == 1 and report.count("| 40.00 |") == 1
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["stages"]["load:load-onnxruntime"]["outputs"] == ["load-onnxruntime.png",
                                                                    "load-onnxruntime.json"]
    verified = project.run("verify", str(folder))
    assert verified.code == 0, verified.out + verified.err
    again = project.run("report", folder.name)
    assert again.code == 0, again.err
    assert "## Serving" in (folder / "report.md").read_text()
