"""run/chain.py on its own: the graph stages of one recipe through a real StageCache (a tiny
MLP exported, optimized and quantized for real), which graph each target builds from, and
which targets need a graph at all."""

from __future__ import annotations

import pytest

from pipeline import backends
from pipeline.core.ui import Progress
from pipeline.recipe import load
from pipeline.run.chain import GraphChain, needs_graph
from pipeline.run.stage_cache import GRAPH_STAGES, StageCache, graph_stage
from pipeline.stages import GRAPH_STAGE_NEEDS
from pipeline.store.recipe_folder import Store
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """The digits recipe (a 64-feature MLP, real data) and a chain over an empty folder."""
    recipe = load(str(ROOT / "recipes" / "digits.yaml"))
    store = Store(tmp_path_factory.mktemp("engines"), recipe.name)
    return recipe, GraphChain(recipe, StageCache(store, recipe, "model", False, Progress()))


def test_every_graph_stage_keeps_the_contract():
    for name in GRAPH_STAGES:
        module = graph_stage(name)
        assert all(hasattr(module, need) for need in GRAPH_STAGE_NEEDS) and module.NAME == name


def test_the_chain_stops_where_asked_then_goes_on_from_the_cache(digits):
    recipe, chain = digits
    exported = chain.run("export")
    assert exported.name == "model.onnx" and set(chain.meta) == {"export"}
    last = chain.run()
    assert last.name == "typed.onnx" and set(chain.meta) == set(GRAPH_STAGES)
    assert chain.exported.name == "model.onnx"
    stages = chain.cache.store.manifest.stages
    assert [stages[s].outputs[0] for s in GRAPH_STAGES] == ["model.onnx", "optimized.onnx", "typed.onnx"]
    done = chain.cache.work_done
    chain.cache.work_done = False
    assert chain.run().sha256 == last.sha256 and not chain.cache.work_done  # all cached
    chain.cache.work_done = done


def test_a_target_builds_from_the_chain_graph_unless_its_backend_takes_plain_onnx(digits):
    recipe, chain = digits
    chain.run()
    (ort,) = recipe.targets
    assert not backends.get(ort.kind).PLAIN_ONNX and chain.for_target(ort) is chain.graph


def test_only_targets_built_from_onnx_need_the_graph():
    recipe = load("standard-aoti")
    by_kind = {t.kind: t for t in recipe.targets}
    assert not needs_graph([by_kind["aotinductor"]], {})
    ort = load("standard").targets[0]
    assert needs_graph([ort], {}) and not needs_graph([ort], {ort.id: "not here"})
