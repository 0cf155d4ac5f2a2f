"""`pipeline tune`: the search over INT8 settings on a tiny LayerNorm MLP, the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Project

MLP = """\
description: LayerNorm MLP
model: {factory: "tests.tiny_models:tiny_mlp"}
inputs:
  - {name: input, dtype: float32, shape: [{name: batch, min: 1, opt: 2, max: 4}, {name: t, min: 1, opt: 16, max: 32}, 64]}
outputs: [y]
data: {calibration: {samples: 2}, validation: {samples: 3}}
export: {exporter: torchscript, opset: 20}
targets: [{kind: onnxruntime}]
validate: {latency: {warmup: 2, iterations: 20, min_seconds: 0, block: 5}}
"""

SEARCH = ("--scheme", "dynamic", "--alpha", "0.5")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    proj = Project(tmp_path_factory.mktemp("tune"))
    proj.write("recipes/mlp.yaml", MLP)
    result = proj.run("tune", "mlp", "--worst-cosine", "0.99", "--mean-cosine", "0.995", *SEARCH)
    assert result.code == 0, result.err
    return proj, result


def test_tune_times_each_candidate_against_the_best_and_writes_a_recipe(tuned):
    proj, result = tuned
    out = json.loads((proj.engines / "mlp" / "tune" / "tune.json").read_text())
    names = [c["name"] for c in out["candidates"]]
    assert names == ["fp32", "dynamic per-channel", "dynamic per-channel smooth 0.5",
                     "dynamic per-tensor", "dynamic per-tensor smooth 0.5"]
    for c in out["candidates"][1:]:
        acc = c["accuracy"]
        assert 0.99 < acc["worst_cosine"] <= acc["mean_cosine"] <= 1.0
        ab = c["ab"]  # within budget: timed interleaved against the best at that point
        assert c["vs"] in names[: names.index(c["name"])]
        assert ab["ci95"][0] <= ab["time_ratio"] <= ab["ci95"][1] and ab["blocks"] >= 6
    chosen = out["chosen"]
    assert "★" in result.out and chosen in names
    if chosen != "fp32":  # the best replaced the reference only on a `faster` verdict
        best = next(c for c in out["candidates"] if c["name"] == chosen)
        assert best["ab"]["verdict"] == "faster"
        text = (proj.path / "recipes" / "mlp-tuned.yaml").read_text()
        assert "extends: mlp.yaml" in text and "scheme: dynamic" in text and "| ★ |" in text
        check = proj.run("recipes")
        assert check.code == 0 and "mlp-tuned" in check.out and "invalid" not in check.out


def _stage_records(proj) -> dict[str, dict]:
    """Each candidate folder's stage records: folder name -> stage id -> record."""
    return {f.name: json.loads((f / "manifest.json").read_text())["stages"]
            for f in sorted(proj.engines.glob("mlp@*"))}


def test_each_candidate_is_a_run_of_the_recipe_on_the_stage_cache(tuned):
    """A candidate is `pipeline run mlp --set precision=... --set targets=...`: its own
    engines/mlp@<digest>/ folder with the ordinary stage records; the export is made once and
    reused by the others (same key); tune keeps no cache of its own."""
    proj, _ = tuned
    out = json.loads((proj.engines / "mlp" / "tune" / "tune.json").read_text())
    records = _stage_records(proj)
    assert sorted(c["engines"] for c in out["candidates"]) == sorted(records)  # one folder each
    for c in out["candidates"]:
        stages = records[c["engines"]]
        assert "build:onnxruntime" in stages and ("precision" in stages) == bool(c["precision"])
        assert Path(c["engine"]).parts[-2:] == (c["engines"], "onnxruntime.onnx")
        manifest = json.loads((proj.engines / c["engines"] / "manifest.json").read_text())
        assert manifest["recipe_overrides"][0] == "precision=" + json.dumps(
            c["precision"], sort_keys=True, separators=(",", ":"))
    assert len({r["export"]["key"] for r in records.values()}) == 1
    assert [p.name for p in (proj.engines / "mlp" / "tune").iterdir()] in (
        ["tune.json", "tune.md"], ["tune.md", "tune.json"])  # no private cache beside them


def test_tune_reuses_cached_candidates_and_rescues_with_exclusions(tuned):
    """A budget nothing meets (--within-only: none is timed): the search adds sensitivity-chosen
    exclusions to one over budget; the first run's stages are reused, not run again."""
    proj, _ = tuned
    before = _stage_records(proj)
    result = proj.run("tune", "mlp", "--worst-cosine", "0.999999", "--mean-cosine", "0.999999",
                      "--out", "strict.yaml", "--within-only", *SEARCH)
    assert result.code == 0, result.err
    after = _stage_records(proj)
    assert all(after[folder] == stages for folder, stages in before.items())  # cached, not rebuilt
    out = json.loads((proj.engines / "mlp" / "tune" / "tune.json").read_text())
    assert out["chosen"] == "fp32" and "nothing beat FP32" in result.err
    rescue, blockwise = out["candidates"][-2:]  # the closest over budget, excluded nodes float or blockwise
    assert rescue["name"].endswith("+ auto-exclude") and rescue["precision"]["sensitivity"]["auto_exclude"]
    assert blockwise["name"] == rescue["name"] + " blockwise" and blockwise["precision"]["fallback"] == "blockwise"
    cost = rescue["speed_cost_of_kept_nodes"]  # what keeping each node out of int8 costs
    assert rescue["excluded"] and [r["node"] for r in cost["nodes"]] == [
        n for n in rescue["excluded"] if n in {r["node"] for r in cost["nodes"]}]
    assert all(r["kept_ms"] is None or r["kept_ms"] >= 0 for r in cost["nodes"])
    assert all("ab" not in c for c in out["candidates"][1:-2])  # the grid, over budget: not timed
    assert not (proj.path / "strict.yaml").exists()


def test_a_rescued_choice_is_written_with_its_exclusions_pinned():
    from types import SimpleNamespace

    import yaml

    from pipeline.commands.tune import recipe_text

    chosen = {"name": "dynamic per-channel + auto-exclude", "excluded": ["node_a", "node_b"],
              "precision": {"mode": "int8", "scheme": "dynamic",
                            "sensitivity": {"enabled": True, "auto_exclude": True}}}
    text = recipe_text(SimpleNamespace(name="m", source="recipes/m.yaml"), chosen, ["| table |"])
    body = yaml.safe_load(text)
    assert body["extends"] == "m.yaml" and "# | table |" in text
    assert body["precision"] == {"mode": "int8", "scheme": "dynamic", "exclude": ["node_a", "node_b"]}


def test_tune_without_calibration_data_is_exit_2(tmp_path):
    proj = Project(tmp_path)
    proj.write("recipes/mlp.yaml", MLP.replace("calibration: {samples: 2}", "calibration: null"))
    result = proj.run("tune", "mlp", *SEARCH)
    assert result.code == 2 and len(result.error_lines) == 1 and "data.calibration" in result.err


def test_tune_holds_candidates_to_the_recipes_task_metric(tmp_path):
    """lm-fp32 (the Shakespeare byte LM): perplexity on held-out passages joins the budget
    (--max-task-loss, else expect.max_task_loss): every candidate carries its perplexity delta
    vs PyTorch with the paired-bootstrap interval, and `within` agrees with the bound."""
    proj = Project(tmp_path)
    result = proj.run("tune", "lm-fp32", "--scheme", "dynamic", "--alpha", "0.5", "--no-exclusions",
                      "--max-task-loss", "0.02", "--worst-cosine", "0.9", "--mean-cosine", "0.9",
                      "--set", "data.validation.samples=3",
                      "--set", "validate.latency={warmup: 2, iterations: 20, min_seconds: 0, block: 5}")
    assert result.code == 0, result.err
    out = json.loads(next(proj.engines.glob("lm-fp32*/tune/tune.json")).read_text())
    assert out["budget"]["task_loss"] == {"bound": 0.02, "kind": "max"}
    for c in out["candidates"]:
        task = c["accuracy"]["task"]
        assert task["metric"] == "perplexity" and task["loss"] == c["accuracy"]["task_loss"]
        assert task["loss"] == pytest.approx(task["delta"])  # lower perplexity is better
        assert task["ci95"][0] <= task["ci95"][1]
        assert ("task_loss" in " ".join(c["within"]["misses"])) == (task["loss"] > 0.02)
    fp32 = out["candidates"][0]["accuracy"]["task"]
    assert abs(fp32["delta"]) < 1e-3  # the FP32 engine does the task as PyTorch does
    assert any(c["accuracy"]["task"]["delta"] != 0 for c in out["candidates"][1:])  # INT8 moves it
    assert "perplexity" in result.out and "task_loss <= 0.02" in result.out  # (the column wraps)
    if out["chosen"] != "fp32":  # the kept recipe's gates hold what the search held it to
        import yaml

        kept = yaml.safe_load((proj.path / "recipes" / "lm-fp32-tuned.yaml").read_text())
        assert kept["expect"] == {"max_task_loss": 0.02}
        assert kept["validate"] == {"tolerance": {"cosine_min": 0.9}}
    assert "perplexity Δ [95% CI]" in next(proj.engines.glob("lm-fp32*/tune/tune.md")).read_text()


def test_a_task_bound_without_task_data_is_exit_2(tmp_path):
    proj = Project(tmp_path)
    proj.write("recipes/mlp.yaml", MLP)
    result = proj.run("tune", "mlp", "--max-task-loss", "0.01", *SEARCH)
    assert result.code == 2 and len(result.error_lines) == 1 and "task-loss bound needs validate.task" in result.err


def test_max_task_loss_takes_a_number_or_a_percentage(tmp_path):
    proj = Project(tmp_path)
    proj.write("recipes/mlp.yaml", MLP)
    result = proj.run("tune", "mlp", "--max-task-loss", "lots", *SEARCH)
    assert result.code == 2 and "neither a number nor a percentage" in result.err


def test_rank_by_prediction_builds_in_order_of_predicted_gain_and_reports_how_it_fared(tmp_path):
    """Each candidate's floor is predicted before its build (the FP32 engine re-priced at its
    precision, this machine's `pipeline hw` entry) and built in order of predicted gain (ties
    in the grid's order); after the builds and timings, predicted and measured gains stand
    side by side and their rank correlation is Spearman's rho of the two."""
    from scipy import stats

    from pipeline.commands import tune

    proj = Project(tmp_path)
    proj.write("recipes/mlp.yaml", MLP)
    result = proj.run("tune", "mlp", "--rank-by-prediction", "--scheme", "dynamic", "--scheme", "static",
                      "--alpha", "0.5", "--no-exclusions", "--worst-cosine", "0.9", "--mean-cosine", "0.9")
    assert result.code == 0, result.err
    out = json.loads((proj.engines / "mlp" / "tune" / "tune.json").read_text())
    fp32, *rest = out["candidates"]
    grid = [c.name for c in tune.space(schemes=("dynamic", "static"), alphas=(None, 0.5))]
    speedups = {c["name"]: c["predicted_speedup"] for c in rest}
    assert sorted(speedups) == sorted(grid) and len(set(speedups.values())) > 1  # the model tells some apart
    assert [c["name"] for c in rest] == sorted(grid, key=lambda n: -speedups[n])  # stable: ties in grid order
    assert fp32["predicted_ms"] == fp32["built_floor_ms"] and fp32["predicted_speedup"] == 1.0
    for c in rest:
        assert "re-priced" in c["prediction"] and c["predicted_ms"] > 0 and c["built_floor_ms"] > 0
    timed = [c for c in out["candidates"] if c.get("chained")]
    rho = stats.spearmanr([c["predicted_speedup"] for c in timed], [1 / c["chained"] for c in timed])[0]
    pred = out["prediction"]
    assert pred["order"] == "by predicted gain" and pred["compared"] == len(timed) == len(grid) + 1
    assert pred["rank_correlation"] == pytest.approx(rho)
    md = (proj.engines / "mlp" / "tune" / "tune.md").read_text()
    assert "predicted gain | measured gain" in md and f"Spearman's rho {rho:+.2f}" in md
