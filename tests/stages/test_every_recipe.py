"""Every shipped recipe builds and validates end to end, through the CLI as a subprocess.

Its own module (it was the end of stages/test_optimize.py): under `--dist loadfile` a module
runs on one xdist worker, and these builds (minutes together) then ran after that module's
own on the same worker while the other idled. The builds other modules also read (standard,
flash, minilm, gpt2-tiny, digits) are conftest's shared_build fixtures, made once for all
workers; a recipe that extends one of them is built beside a copy of it, as it would be in
a user's engines/, so the stages it shares (same key: its export) are copied, not redone.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.conftest import FAST_OPT, ROOT, Project

FIXTURES = {"standard": "built_standard", "flash": "built_flash", "minilm": "built_minilm",
            "gpt2-tiny": "built_gpt2", "digits": "built_digits"}


# Recipes another test builds end to end, or too slow for the suite's budget (built by hand,
# figures in README.md).
BUILT_ELSEWHERE = {
    **{name: "built end to end, gates included, by the `pipeline compare` of tests/commands/test_compare.py "
             "(a timing module: `make test` runs it after this part)"
       for name in ("flash-int4", "standard-int8")},
    "standard-aoti": "standard plus an AOTInductor target (and TensorRT, not installed here): standard is built "
                     "here and tests/backends/test_torch.py builds standard-aoti's AOTInductor target end to "
                     "end (a second ~30 s C++ compile of the same model would add nothing)",
    **{f"lm-{p}": "the lm-* recipes share model and data; tests/metrics/test_task.py builds lm-int4 end to "
                  "end (perplexity, the max_task_loss gate) and standard-fp16/int8 cover the precisions"
       for p in ("fp32", "fp16", "int8", "int4")},
    "minilm-int8": "BERT export + INT8 with sensitivity take minutes on 2 cores; tests/data/test_sources.py "
                   "covers its data (pairs, the model's tokenizer), minilm its build, and "
                   "tests/precision/test_int8.py and tests/commands/test_tune.py the dynamic scheme, smoothing and the "
                   "search on small models (benchmarks/peer_int8.py builds it)",
    **{name: "a generation workload times prefill and decode of every point (minutes on 2 cores); "
             "tests/generation/test_run.py builds standard-gen end to end and standard-int8 / "
             "flash-int4 cover the precisions"
       for name in ("standard-gen", "standard-gen-int8", "standard-gen-int4", "flash-gen",
                    "lm-gen", "lm-gen-int8", "lm-gen-int4")},
}
# Every smollm2-* recipe (matched by name, so a new variant cannot slip into the suite: two did,
# and their builds took 12 and 5 minutes of it).
SMOLLM2 = ("the real 135M chat model: an export takes 5-25 min on 2 cores and a 5,120-token point "
           "much longer; tests/generation/test_chat_smollm2.py loads it once and "
           "tests/generation/test_chat.py builds the chat workload end to end on the byte LM "
           "(figures: benchmarks/results/smollm2-* and kv-cache-*)")


def _recipe_params():
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        text = path.read_text()
        if path.stem in BUILT_ELSEWHERE:
            yield pytest.param(path.stem, marks=pytest.mark.skip(reason=BUILT_ELSEWHERE[path.stem]))
        elif path.stem.startswith("smollm2-"):
            yield pytest.param(path.stem, marks=pytest.mark.skip(reason=SMOLLM2))
        elif "glm-base" in text:  # ~201M parameters: sized for GPUs (`make gpu-check` builds them)
            yield pytest.param(path.stem, marks=pytest.mark.skip(
                reason=f"{path.stem} is the ~201M-parameter GLM, sized for `make gpu-check` on a "
                       "GPU; building it on 2 CPU cores takes longer than the whole suite may"))
        else:
            yield path.stem


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_recipe_params()))
def test_every_recipe_builds_and_validates(request, tmp_path, name):
    """Builds and validates: every engine is built (or skipped with its reason, e.g. no
    TensorRT here) and carries accuracy, latency and gates. A recipe whose gates fail exits 3
    with the report written (with this test's shortened timing and data a gate may fail that
    the full recipe meets)."""
    if name in FIXTURES:  # built once per session, shared with the tests that read its outputs
        proj = request.getfixturevalue(FIXTURES[name])
        code, folder = 0, proj.built
    else:
        proj = Project(tmp_path)
        parent = re.search(r"^extends: (\S+)\.yaml$", (ROOT / "recipes" / f"{name}.yaml").read_text(), re.M)
        if parent and parent[1] in FIXTURES:  # beside the recipe it extends, as in a user's
            # engines/: the stages it shares with it (same key: its export) are copied
            shutil.copytree(request.getfixturevalue(FIXTURES[parent[1]]).engines, proj.engines)
        result = proj.run("run", name, *FAST_OPT)
        code, folder = result.code, proj.folder(result)
        assert code in (0, 3), result.err
    report = json.loads((folder / "report.json").read_text())
    assert report["optimize"]["nodes_after"] <= report["optimize"]["nodes_before"]
    built = [e for e in report["engines"] if e["status"] == "built"]
    assert built and all(e["status"] == "built" or e["reason"] for e in report["engines"])
    for e in built:
        assert e["accuracy"] and e["latency_ms"]["n"] > 0 and e["gates"]
    passed = all(g["passed"] for e in built for g in e["gates"])
    assert passed == (code == 0)


