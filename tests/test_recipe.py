"""Recipe loading: schema, extends:, --set, and one clear message per mistake."""

from __future__ import annotations

import pytest

from pipeline import recipe as recipe_mod
from pipeline.errors import RecipeError
from pipeline.recipe import Dim


@pytest.fixture
def chdir_project(project, monkeypatch):
    monkeypatch.chdir(project.path)
    return project


def test_standard_and_flash_share_the_base(chdir_project):
    standard = recipe_mod.load("standard")
    flash = recipe_mod.load("flash")
    assert standard.name == "standard" and flash.name == "flash"
    assert standard.inputs == flash.inputs  # inherited from base/glm-tiny.yaml
    assert standard.model.kwargs["attention"] == "dense"
    assert flash.model.kwargs["attention"] == "block_sparse"
    assert flash.model.kwargs["ffn_prune"] == 0.5
    assert flash.model.kwargs["size"] == "tiny"  # merged key by key from the base
    assert standard.digest != flash.digest


def test_dims_and_profile_points(chdir_project):
    r = recipe_mod.load("standard")
    (ids,) = r.inputs
    assert isinstance(ids.shape[0], Dim) and ids.shape[0].name == "batch"
    assert ids.dims("min") == (1, 1) and ids.dims("opt") == (2, 64) and ids.dims("max") == (8, 128)


def test_set_overrides_parse_yaml_values(chdir_project):
    r = recipe_mod.load("standard", ["validate.threads=2", "targets.0.provider=cpu",
                                     "model.kwargs.ffn_prune=0.25", "outputs=[logits]"])
    assert r.validation.threads == 2
    assert r.targets[0].provider == "cpu"
    assert r.model.kwargs["ffn_prune"] == 0.25
    assert r.outputs == ["logits"]


def test_digest_tracks_content(chdir_project):
    a = recipe_mod.load("standard")
    b = recipe_mod.load("standard", ["data.seed=1"])
    assert a.digest == recipe_mod.load("standard").digest
    assert a.digest != b.digest


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["bogus=1"], "bogus: unknown key; allowed: description, model, inputs"),
        (["model.kwargs.size=huge"], "model.kwargs.size: Input should be 'tiny', 'small' or 'base' (got 'huge')"),
        (["model.kwargs.heads=3"], "model.kwargs.heads: unknown key"),
        (["data.seed=abc"], "data.seed: Input should be a valid integer"),
        (["inputs.0.shape.1.min=500"], "inputs.0.shape.1: needs min <= opt <= max (got 500, 64, 128)"),
        (["inputs.0.shape.0=0"], "inputs.0.shape.0: Input should be greater than or equal to 1 (got 0)"),
        (["targets.0.kind=tensorrtx"], "targets.0: unknown target kind 'tensorrtx'"),
        (["targets.0.provider=gpu"], "targets.0.provider: Input should be 'auto', 'cpu' or 'cuda'"),
        (["inputs.0.range=null"], "integer input `input_ids` needs `range: [low, high]`"),
        (["model.factory=pkg.mod:fn"], "model: give exactly one of `zoo` (a built-in model), `factory` or `transformers`"),
        (["validate.tolerance.cosine_min=2"], "validate.tolerance.cosine_min: Input should be less than or equal to 1"),
        (["nokey"], "--set nokey: expected KEY.PATH=VALUE"),
        (["targets.5.kind=onnxruntime"], "`5` is not an index of a list of 2"),
    ],
)
def test_bad_values_name_key_and_allowed(chdir_project, overrides, expected):
    with pytest.raises(RecipeError) as info:
        recipe_mod.load("standard", overrides)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_error_names_the_file_that_set_the_key(chdir_project):
    chdir_project.write("recipes/typo.yaml", "extends: standard.yaml\nmodel:\n  kwargs: {sizee: tiny}\n")
    with pytest.raises(RecipeError, match=r"^recipes/typo\.yaml: model\.kwargs\.sizee: unknown key"):
        recipe_mod.load("typo")
    with pytest.raises(RecipeError, match=r"^--set model\.kwargs\.x=1: model\.kwargs\.x: unknown key"):
        recipe_mod.load("standard", ["model.kwargs.x=1"])


def test_extends_missing_file_and_cycle(chdir_project):
    chdir_project.write("recipes/orphan.yaml", "extends: nowhere.yaml\n")
    with pytest.raises(RecipeError, match=r"recipes/orphan\.yaml: extends: nowhere\.yaml: no such file"):
        recipe_mod.load("orphan")
    chdir_project.write("recipes/a.yaml", "extends: b.yaml\n")
    chdir_project.write("recipes/b.yaml", "extends: a.yaml\n")
    with pytest.raises(RecipeError, match=r"extends: cycle .*a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        recipe_mod.load("a")


def test_malformed_yaml_names_the_line(chdir_project):
    chdir_project.write("recipes/broken.yaml", "model:\n  zoo: glm\n  kwargs: {size: tiny\n")
    with pytest.raises(RecipeError, match=r"recipes/broken\.yaml: line \d+, column \d+: malformed YAML"):
        recipe_mod.load("broken")
    chdir_project.write("recipes/list.yaml", "- just\n- a list\n")
    with pytest.raises(RecipeError, match="a recipe is a mapping of sections, got list"):
        recipe_mod.load("list")


def test_unknown_recipe_lists_the_available_ones(chdir_project):
    with pytest.raises(RecipeError) as info:
        recipe_mod.load("nope")
    assert "unknown recipe `nope`" in str(info.value)
    assert "standard" in str(info.value) and "flash" in str(info.value)


def test_recipe_by_path(chdir_project):
    r = recipe_mod.load(str(chdir_project.path / "recipes" / "flash.yaml"))
    assert r.name == "flash"


def test_shared_dim_symbols_must_agree(chdir_project):
    chdir_project.write("recipes/two.yaml", """
extends: standard.yaml
inputs:
  - {name: a, dtype: float32, shape: [{name: batch, min: 1, opt: 2, max: 4}]}
  - {name: b, dtype: float32, shape: [{name: batch, min: 1, opt: 2, max: 8}]}
""")
    with pytest.raises(RecipeError, match="dim `batch` is declared with different ranges"):
        recipe_mod.load("two")


def test_every_shipped_recipe_is_valid():
    from tests.conftest import ROOT

    paths = recipe_mod.list_recipes(ROOT / "recipes")
    assert {"standard", "flash"} <= {p.stem for p in paths}
    for path in paths:
        assert recipe_mod.load(path).targets
