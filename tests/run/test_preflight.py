"""run/preflight.py on its own: the checks before any work, each one clear error with
nothing written (store/test_folder_names.py has a recipe's folder name back and forth)."""

from __future__ import annotations

import pytest

from pipeline.core import deps
from pipeline.core.errors import DependencyError, RecipeError
from pipeline.recipe import load
from pipeline.run import preflight
from pipeline.store.recipe_folder import Store


def test_a_cuda_baseline_needs_a_gpu_and_a_cuda_torch():
    recipe = load("standard", ["validate.device=cuda"])
    if deps.gpus() and not (deps.version("torch") or "").endswith("+cpu"):
        pytest.skip("this machine has a GPU and a CUDA torch: the check passes here")
    with pytest.raises(DependencyError, match="validate.device: cuda, but"):
        preflight.check_baseline_device(recipe)
    preflight.check_baseline_device(load("standard", ["validate.device=cpu"]))  # nothing to check


def test_expect_faster_than_loads_other_recipes_and_refuses_itself():
    loaded = preflight.expect_recipes(load("standard", ["expect.faster_than=[flash]"]))
    assert list(loaded) == ["flash"] and loaded["flash"].name == "flash"
    with pytest.raises(RecipeError, match="is this recipe itself"):
        preflight.expect_recipes(load("standard", ["expect.faster_than=[standard]"]))
    with pytest.raises(RecipeError, match="expect.faster_than"):
        preflight.expect_recipes(load("standard", ["expect.faster_than=[no-such-recipe]"]))


def test_a_target_that_cannot_be_built_here_is_skipped_unless_required():
    if not deps.has("tensorrt") or not deps.gpus():
        trt = load("standard").targets[1]
        assert list(preflight.unavailable_targets([trt])) == [trt.id]
        with pytest.raises(DependencyError, match="is required but cannot be built here"):
            preflight.unavailable_targets([trt.model_copy(update={"required": True})])
    ort = load("standard").targets[0]
    assert preflight.unavailable_targets([ort]) == {}


def test_a_folder_built_by_another_recipe_file_of_the_same_name_is_refused(tmp_path):
    here, there = tmp_path / "a", tmp_path / "b"
    for folder in (here, there):
        folder.mkdir()
        (folder / "standard.yaml").write_text("extends: " + str(load("standard").source) + "\n")
    mine, theirs = load(str(here / "standard.yaml")), load(str(there / "standard.yaml"))
    store = Store(tmp_path / "engines", "standard")
    store.manifest.recipe_file = str(theirs.source)
    with pytest.raises(RecipeError, match="two recipe files named `standard`"):
        preflight.folder_owner(store, mine)
    preflight.folder_owner(store, theirs)  # its own folder
    (there / "standard.yaml").unlink()
    preflight.folder_owner(store, mine)  # the file that built it is gone: the folder is free
