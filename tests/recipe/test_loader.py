"""Recipe loading: schema, extends:, --set, and one clear message per mistake."""

from __future__ import annotations

import pytest

from pipeline import recipe as recipe_mod
from pipeline.core.errors import RecipeError
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
    assert r.validate_.threads == 2
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
        # non-finite floats: an infinite min_seconds would time forever
        (["validate.latency.min_seconds=.inf"],
         "--set validate.latency.min_seconds=.inf: validate.latency.min_seconds: Input should be a finite number (got inf)"),
        (["validate.latency.monitor_interval=.nan"], "validate.latency.monitor_interval: Input should be a finite number"),
        (["expect.max_p99_ms=.inf"], "expect.max_p99_ms: Input should be a finite number"),
        (["precision.percentile=.nan"], "precision.percentile: Input should be a finite number"),
        (["targets.1.layer_precision_min_share=.nan"], "targets.1.layer_precision_min_share: Input should be a finite"),
        (["inputs.0.range=[0, .inf]"], "inputs.0.range.1: Input should be a finite number (got inf)"),
        # strict types: no silent bool -> int, "7" -> 7, 8.0 -> 8, 1 -> True
        (["data.seed=true"], "data.seed: Input should be a valid integer (got true)"),
        (["data.seed='7'"], "data.seed: Input should be a valid integer (got '7'; write it without quotes)"),
        (["data.validation.samples=8.0"], "data.validation.samples: Input should be a valid integer (got 8.0)"),
        (["inputs.0.shape.0=true"], "inputs.0.shape.0: Input should be a valid integer (got true)"),
        (["validate.latency.spin=1"], "validate.latency.spin: Input should be a valid boolean (got 1)"),
        (["targets.1.optimization_level=false"], "targets.1.optimization_level: Input should be a valid integer (got false)"),
        # loader-only fields are unknown keys like any other
        (["name=evil"], "--set name=evil: name: unknown key; allowed: description, model, inputs"),
        (["source=/etc"], "--set source=/etc: source: unknown key"),
        # wording: the key path once, the right schema's keys, mappings and kinds named
        (["targets=[{}]"], "targets.0.kind: required key is missing; allowed: onnxruntime, tensorrt, aotinductor"),
        (["targets=[{kind: tensorrt, provider: cpu}]"],
         "targets.0.provider: unknown key; allowed: name, required, kind, profiles, optimization_level"),
        (["targets.-1.provider=cpu"], "--set targets.-1.provider=cpu: targets.1.provider: unknown key; allowed: name, required, kind, profiles"),
        (["model=null"], "model: must be a mapping of keys (`key: value`), got null"),
        (["validate.latency.sweep={nope: [1]}"],
         "--set validate.latency.sweep={nope: [1]}: validate.latency.sweep: `nope` is not a dim symbol"),
        (["validate.latency.sweep={5: [1]}"], "validate.latency.sweep.5: the key should be a valid string (got 5)"),
        (["validate.top1_outputs=[nope]"], "validate.top1_outputs.0: `nope` is not one of outputs ['logits']"),
        (["precision.mode=int8", "data.calibration=null"],
         "--set data.calibration=null: data.calibration: precision.mode int8 needs calibration data"),
        (["optimize.options={fold_constants: {x: 1}}"],
         "--set optimize.options={fold_constants: {x: 1}}: optimize.options.fold_constants: pass `fold_constants` has no option x"),
        (["precision.exclude=['(']"], "precision.exclude: `(` is not a valid regex"),
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


def test_no_message_shows_a_key_path_twice_or_at_top_level(chdir_project):
    for overrides in (["validate.latency.sweep={nope: [1]}"], ["validate.top1_outputs=[nope]"],
                      ["expect.max_accuracy_loss=0.1", "outputs=[hidden]"], ["precision.exclude=['(']"],
                      ["targets=[{kind: onnxruntime}, {kind: onnxruntime}]"]):
        with pytest.raises(RecipeError) as info:
            recipe_mod.load("standard", overrides)
        message = str(info.value)
        assert "(top level)" not in message and "exclude: exclude" not in message, message


def test_duplicate_keys_name_file_line_and_key(chdir_project):
    chdir_project.write("recipes/dup.yaml", "extends: standard.yaml\nvalidate: {threads: 1}\n"
                        "validate: {threads: 2}\n")
    with pytest.raises(RecipeError, match=r"^recipes/dup\.yaml: line 3: duplicate key `validate`, "
                       r"also on line 2 \(a mapping holds each key once"):
        recipe_mod.load("dup")
    chdir_project.write("recipes/dup2.yaml", "extends: standard.yaml\nvalidate:\n  latency:\n"
                        "    warmup: 5\n    block: 5\n    warmup: 6\n")
    with pytest.raises(RecipeError, match=r"^recipes/dup2\.yaml: line 6: validate\.latency: "
                       r"duplicate key `warmup`, also on line 4"):
        recipe_mod.load("dup2")
    # anchors, aliases and `<<` merge keys (overriding a merged key) are not duplicates
    chdir_project.write("recipes/merge.yaml", "extends: standard.yaml\nvalidate:\n"
                        "  tolerance: &t {cosine_min: 0.9}\n  latency:\n    <<: {warmup: 5, block: 5}\n"
                        "    warmup: 7\nexpect: {faster_than: []}\n")
    r = recipe_mod.load("merge")
    assert (r.validate_.latency.warmup, r.validate_.latency.block) == (7, 5)


def test_duplicate_keys_in_a_set_value(chdir_project):
    with pytest.raises(RecipeError, match=r"^--set validate=\{threads: 1, threads: 2\}: duplicate key `threads` \("):
        recipe_mod.load("standard", ["validate={threads: 1, threads: 2}"])


def test_exponent_floats_without_a_dot_are_floats(chdir_project):
    # YAML 1.1 (PyYAML) reads `1e-3` as a string; the schema's floats are strict
    chdir_project.write("recipes/exp.yaml", "extends: standard.yaml\nvalidate:\n  tolerance: {max_abs: 1e-3}\n")
    assert recipe_mod.load("exp").validate_.tolerance.max_abs == 0.001
    r = recipe_mod.load("standard", ["export.parity.max_abs=5e-2", "validate.latency.min_seconds=2E0"])
    assert (r.export.parity.max_abs, r.validate_.latency.min_seconds) == (0.05, 2.0)
    assert recipe_mod.load("standard", ["description=e3"]).description == "e3"


def test_loader_only_keys_are_unknown_in_yaml(chdir_project):
    for key in ("name: evil", "source: /etc/passwd"):
        chdir_project.write("recipes/sneaky.yaml", f"extends: standard.yaml\n{key}\n")
        with pytest.raises(RecipeError, match=rf"^recipes/sneaky\.yaml: {key.split(':')[0]}: unknown key; "
                           "allowed: description, model"):
            recipe_mod.load("sneaky")
    assert recipe_mod.load("standard").name == "standard"


def test_empty_file_and_odd_keys(chdir_project):
    chdir_project.write("recipes/empty.yaml", "# nothing yet\n")
    with pytest.raises(RecipeError, match=r"^recipes/empty\.yaml: the file is empty \(a recipe needs"):
        recipe_mod.load("empty")
    chdir_project.write("recipes/boolkey.yaml", "extends: standard.yaml\ntrue: 1\n")
    with pytest.raises(RecipeError, match=r"^recipes/boolkey\.yaml: true: a key must be a string, got true"):
        recipe_mod.load("boolkey")
    chdir_project.write("recipes/nullmodel.yaml", "extends: standard.yaml\nmodel: null\n")
    with pytest.raises(RecipeError, match=r"^recipes/nullmodel\.yaml: model: must be a mapping of keys"):
        recipe_mod.load("nullmodel")


@pytest.mark.parametrize("stem", ["ü", "aü", "-a"])
def test_recipe_file_names_are_ascii(chdir_project, stem):
    path = chdir_project.write(f"recipes/{stem}.yaml", "extends: standard.yaml\n")
    with pytest.raises(RecipeError, match="must start with an ASCII letter or digit and hold only ASCII letters"):
        recipe_mod.load(path)


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


def test_a_gguf_recipe_loads_from_the_files_header_without_converting(tmp_path, monkeypatch):
    """Loading smollm2-flash derives its KV-cache signature from the GGUF header: the
    minute-long conversion waits for the export."""
    monkeypatch.setenv("PIPELINE_GGUF_CACHE", str(tmp_path / "gguf"))
    recipe = recipe_mod.load("smollm2-flash")
    past = recipe.inputs[2]
    assert past.name == "past_key_values.0.key" and past.shape[1] == 3 and past.shape[3] == 64
    assert len(recipe.inputs) == 2 + 2 * 30
    assert not (tmp_path / "gguf").exists() or not any((tmp_path / "gguf").iterdir())


def test_a_registered_target_kind_changes_the_registry_not_the_recipe_class(chdir_project):
    """A plugin's target schema joins targets.SCHEMAS; the Recipe class (its fields and
    validator) stays the one imported, and a recipe validated after that takes the new kind,
    names its keys in messages, and dumps its fields. Removing the kind again is seen too."""
    from typing import Literal

    from pipeline.recipe import Recipe, TargetBase
    from pipeline.recipe.plugins import add_target_schema
    from pipeline.recipe.targets import SCHEMAS

    class PluginTarget(TargetBase):
        kind: Literal["plugin-kind"] = "plugin-kind"
        level: int = 1

    annotation, validator = Recipe.model_fields["targets"].annotation, Recipe.__pydantic_validator__
    with pytest.raises(RecipeError, match="unknown target kind 'plugin-kind'"):
        recipe_mod.load("standard", ["targets=[{kind: plugin-kind}]"])
    add_target_schema(PluginTarget)
    try:
        assert Recipe.model_fields["targets"].annotation is annotation
        assert Recipe.__pydantic_validator__ is validator
        loaded = recipe_mod.load("standard", ["targets=[{kind: plugin-kind, level: 3}]"])
        assert isinstance(loaded.targets[0], PluginTarget) and loaded.targets[0].level == 3
        assert loaded.model_dump(mode="json")["targets"] == [PluginTarget(level=3).model_dump(mode="json")]
        assert loaded.model_dump(mode="json")["targets"][0]["level"] == 3
        with pytest.raises(RecipeError) as info:
            recipe_mod.load("standard", ["targets=[{kind: plugin-kind, levl: 3}]"])
        assert "targets.0.levl: unknown key; allowed: name, required, kind, level" in str(info.value)
        with pytest.raises(RecipeError) as info:
            recipe_mod.load("standard", ["targets=[{}]"])
        assert "allowed: onnxruntime, tensorrt, aotinductor, plugin-kind" in str(info.value)
        assert "plugin-kind" in str(Recipe.model_json_schema())
    finally:
        del SCHEMAS["plugin-kind"]
    with pytest.raises(RecipeError, match="unknown target kind 'plugin-kind'"):
        recipe_mod.load("standard", ["targets=[{kind: plugin-kind}]"])
