"""model/sources.py: a model's inputs checked against its forward() signature."""

from __future__ import annotations

import pytest

from pipeline.core.errors import RecipeError
from pipeline.recipe import Recipe


def test_inputs_listed_out_of_forward_order_are_refused():
    """forward(query, key) with inputs [key, query]: ONNX would feed `key` to `query`."""
    from pipeline.model import sources as models

    spec = {"dtype": "float32", "shape": [2, 3]}
    r = Recipe.model_validate({"model": {"factory": "tests.data_models:query_key"},
                               "inputs": [{"name": "key", **spec}, {"name": "query", **spec}],
                               "targets": [{"kind": "onnxruntime"}]})
    with pytest.raises(RecipeError, match=r"do not match Model.forward\(query, key\): they are listed in "
                                          "another order") as info:
        models.load(r)
    assert info.value.exit_code == 2
    r = r.model_copy(update={"inputs": [r.inputs[0].model_copy(update={"name": "q"}), r.inputs[1]]})
    with pytest.raises(RecipeError, match="forward\\(\\) has no parameter `q`"):
        models.load(r)
