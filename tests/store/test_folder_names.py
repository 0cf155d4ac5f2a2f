"""store/folder_names.py on its own: the engines/ folder a recipe writes into, and a
folder's name back to its recipe with the --set values its manifest records; a manifest
that does not match the name, or whose values would choose code, is refused. Real
manifests written by the store in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.errors import IntegrityError, RecipeError
from pipeline.recipe import load
from pipeline.store.folder_names import folder_name, overrides_digest
from pipeline.store.folder_names import load as load_folder
from pipeline.store.recipe_folder import Store


def _built(root: Path, name: str, recorded: list[str]) -> None:
    """An engines folder NAME whose manifest records the --set values RECORDED."""
    store = Store(root, name)
    store.dir.mkdir(parents=True)
    store.save_manifest(recipe_overrides=recorded)


def test_a_folder_name_carries_the_set_values_and_leads_back_to_them(tmp_path):
    plain, varied = load("standard"), load("standard", ["validate.threads=1"])
    assert folder_name(plain) == "standard"
    assert folder_name(varied) == f"standard@{overrides_digest(['validate.threads=1'])}"
    assert overrides_digest(["a=1", "b=2"]) != overrides_digest(["b=2", "a=1"])  # order matters
    store = Store(tmp_path, folder_name(varied))
    store.dir.mkdir(parents=True)
    store.save_manifest(recipe_overrides=["validate.threads=1"])
    again = load_folder(folder_name(varied), engines_root=tmp_path)
    assert again.validate_.threads == 1 and folder_name(again) == folder_name(varied)
    with pytest.raises(RecipeError, match="no engines folder"):
        load_folder("standard@00000000", engines_root=tmp_path)


def test_later_values_apply_after_the_recorded_ones_and_a_plain_name_reads_no_folder(tmp_path):
    recorded = ["validate.threads=1", "data.validation.samples=3"]
    name = f"standard@{overrides_digest(recorded)}"
    _built(tmp_path, name, recorded)
    again = load_folder(name, ("validate.threads=2",), engines_root=tmp_path)
    assert again.validate_.threads == 2 and again.data.validation.samples == 3
    assert list(again.overrides) == [*recorded, "validate.threads=2"]
    # a plain recipe name is recipe.load's: no folder is read
    assert load_folder("standard", engines_root=tmp_path / "none").name == "standard"


def test_a_folder_whose_manifest_records_other_values_than_its_name_is_refused(tmp_path):
    name = f"standard@{overrides_digest(['validate.threads=1'])}"
    _built(tmp_path, name, ["validate.threads=2"])  # renamed, or its manifest edited
    with pytest.raises(RecipeError, match="recording the --set values it was built with") as info:
        load_folder(name, engines_root=tmp_path)
    assert info.value.exit_code == 2


def test_recorded_values_that_choose_code_are_refused_as_data(tmp_path):
    recorded = ["model.factory=planted:build"]  # a folder is data: it may not choose an import
    name = f"standard@{overrides_digest(recorded)}"
    _built(tmp_path, name, recorded)
    with pytest.raises(IntegrityError, match="choose code to import and run") as info:
        load_folder(name, engines_root=tmp_path)
    assert info.value.exit_code == 5 and "model.factory" in str(info.value)
