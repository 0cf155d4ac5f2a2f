"""Property-based fuzzing of the recipe loader: whatever the input (random YAML trees, random
text, mutated valid recipes, random --set strings), `recipe.load` returns a valid Recipe or
raises a PipelineError with a one-line message; never any other exception."""

from __future__ import annotations

import copy
import os

import pytest
import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from pipeline import recipe as recipe_mod
from pipeline.core.errors import PipelineError
from pipeline.recipe import loader as recipe_loader

# A fixed, fast sample in the suite; PIPELINE_FUZZ_EXAMPLES=5000 for a long random hunt.
_HUNT = int(os.environ.get("PIPELINE_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_HUNT or 60, deadline=None, derandomize=not _HUNT,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

SECTIONS = ["extends", "description", "model", "inputs", "outputs", "data", "export", "targets",
            "validate", "zoo", "factory", "kwargs", "weights", "name", "dtype", "shape", "range",
            "min", "opt", "max", "kind", "provider", "seed", "samples", "tolerance", "latency"]
scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(["glm", "tiny", "int64", "onnxruntime", "opt", "../standard.yaml",
                              "standard.yaml", "/etc/hostname", "dynamo", "cpu"]))
keys = st.sampled_from(SECTIONS) | st.text(max_size=8) | st.integers(-3, 3)
trees = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(keys, inner, max_size=5), max_leaves=30)


@pytest.fixture
def workdir(project, monkeypatch):
    monkeypatch.chdir(project.path)
    return project


def load_or_clean_error(text: str | bytes, overrides=()) -> None:
    path = recipe_mod.recipes_dir() / "fuzz.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    try:
        recipe = recipe_mod.load(path, list(overrides))
    except PipelineError as e:
        message = str(e)
        assert message and "\n" not in message, repr(message)
        assert "Traceback" not in message
        event(f"error: {type(e).__name__}")
        return
    event("valid recipe")
    assert isinstance(recipe, recipe_mod.Recipe)
    recipe.digest  # noqa: B018 - a loaded recipe must also hash (cache keys)


def _dump(tree) -> str:
    try:
        return yaml.safe_dump(tree, allow_unicode=True)
    except (yaml.YAMLError, UnicodeEncodeError):
        assume(False)
        raise  # unreachable


@FUZZ
@given(tree=trees)
def test_random_yaml_trees(workdir, tree):
    load_or_clean_error(_dump(tree))


@FUZZ
@given(tree=st.dictionaries(keys, trees, max_size=6))
def test_random_trees_over_a_valid_base(workdir, tree):
    load_or_clean_error(_dump({**tree, "extends": "standard.yaml"}))


@FUZZ
@given(text=st.text(max_size=200) | st.binary(max_size=200))
def test_random_text_and_bytes(workdir, text):
    load_or_clean_error(text)


@st.composite
def mutated(draw):
    """The merged `standard` recipe with a few random deletions, replacements and insertions."""
    raw, _ = recipe_loader._load_merged(recipe_loader.recipes_dir() / "standard.yaml", ())
    raw = copy.deepcopy(raw)
    for _ in range(draw(st.integers(1, 4))):
        node = raw
        while isinstance(node, (dict, list)) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node, key=str) if isinstance(node, dict) else range(len(node))))
            if not isinstance(node[key], (dict, list)):
                break
            node = node[key]
        action = draw(st.sampled_from(["replace", "delete", "insert"]))
        if isinstance(node, dict) and node:
            key = draw(st.sampled_from(sorted(node, key=str)))
            if action == "delete":
                del node[key]
            else:
                node[key if action == "replace" else draw(keys)] = draw(trees)
        elif isinstance(node, list) and node:
            index = draw(st.integers(0, len(node) - 1))
            if action == "delete":
                del node[index]
            else:
                node.insert(index, draw(trees)) if action == "insert" else node.__setitem__(index, draw(trees))
    return raw


@FUZZ
@given(raw=mutated())
def test_mutated_valid_recipes(workdir, raw):
    load_or_clean_error(_dump(raw))


paths = st.lists(st.sampled_from(SECTIONS) | st.integers(-2, 3).map(str) | st.text(max_size=5),
                 min_size=1, max_size=5).map(".".join)
values = st.text(max_size=30) | scalars.map(lambda v: yaml.safe_dump(v).strip().removesuffix("..."))


@FUZZ
@given(sets=st.lists(st.text(max_size=40) | st.builds(lambda p, v: f"{p}={v}", paths, values),
                     min_size=1, max_size=4))
def test_random_set_overrides(workdir, sets):
    load_or_clean_error("extends: standard.yaml\n", sets)
