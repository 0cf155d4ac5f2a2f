"""`pipeline compare` of two generation recipes end to end (tiny GLM): time per task and at the
long point, each phase with a verdict, and the op-category profiles (pipeline/compare/generation.py)."""

from __future__ import annotations

import json

from tests.generation.test_run import LONG, built_gen  # noqa: F401  (the shared build fixture)


def test_compare_times_the_task_and_the_long_point_with_verdicts(built_gen):  # noqa: F811
    proj = built_gen  # standard-gen of the LONG workload, built once for the session
    standard = proj.built
    flash = proj.run("run", "flash-gen", "--target", "onnxruntime", *LONG, "--set", "optimize.options={}")
    assert flash.code == 0, flash.err
    res = proj.run("compare", standard.name, proj.folder(flash).name)  # <recipe>@<hash>
    a, b = "standard-gen", "flash-gen"
    assert res.code == 0, res.err
    (folder,) = (proj.engines / "compare").iterdir()
    result = json.loads((folder / "compare-generation.json").read_text())
    assert result["long"]["prompt"] == 24 and result["long"]["new_tokens"] == 4
    assert set(result["long"]["engines"]) == {f"{a}/onnxruntime", f"{b}/onnxruntime"}
    for point in (result["versus"][0], result["long"]["versus"][0]):
        for phase in ("task", "prefill", "decode"):
            assert point[phase]["verdict"] in ("faster", "slower", "indistinguishable")
            lo, hi = point[phase]["ci95"]
            assert lo <= point[phase]["time_ratio"] <= hi
    # a long request is longer than one turn of the task: its prompt alone is 24 tokens
    assert result["long"]["engines"][f"{a}/onnxruntime"]["prompt_tokens"] == [24]
    assert "long point (24-token prompt + 4)" in res.out
    md = (folder / "compare-generation.md").read_text()
    assert f"| {b}/onnxruntime, long point |" in md
