"""recipe/serve.py: the `serve:` section's defaults (batch sizes, length buckets), what it
refuses, and that serving settings do not change the recipe's digest."""

from __future__ import annotations

import pytest

from pipeline.recipe.serve import batching, buckets, variable_dims


def serve_recipe(serve: dict | None = None):
    """A recipe of two token inputs (batch 1-8, sequence 2-32) with this `serve:` section."""
    from pipeline.recipe.schema import Recipe

    dims = [{"name": "batch", "min": 1, "opt": 2, "max": 8}, {"name": "sequence", "min": 2, "opt": 16, "max": 32}]
    return Recipe.model_validate({
        "model": {"factory": "m:build"},
        "inputs": [{"name": "input_ids", "dtype": "int64", "shape": dims, "range": [0, 100]},
                   {"name": "attention_mask", "dtype": "int64", "shape": dims, "range": [1, 2]}],
        "outputs": ["hidden"], "targets": [{"kind": "onnxruntime"}], "serve": serve or {}})


def test_serve_defaults_follow_the_batch_dim_and_powers_of_two_buckets():
    r = serve_recipe()
    assert batching(r.serve, r.inputs) == (8, (2, 8))
    assert buckets(r.serve, "sequence", variable_dims(r.inputs)["sequence"]) == [2, 4, 8, 16, 32]
    r = serve_recipe({"max_batch_size": 4, "preferred_batch_sizes": [], "length_buckets": {"sequence": [10]}})
    assert batching(r.serve, r.inputs) == (4, ())
    assert buckets(r.serve, "sequence", variable_dims(r.inputs)["sequence"]) == [10, 32]


@pytest.mark.parametrize("serve, words", [
    ({"max_batch_size": 16}, "exceeds what the engine accepts"),
    ({"preferred_batch_sizes": [9]}, "exceed max_batch_size"),
    ({"length_buckets": {"tokens": [4]}}, "not a variable-length dim"),
    ({"length_buckets": {"sequence": [64]}}, "outside the dim's"),
    ({"max_queue_delay_us": -1}, "greater than or equal"),
    ({"routing": "prefix", "ingress": "replica"}, "routing: prefix needs ingress: separate"),
])
def test_a_serve_section_that_cannot_hold_is_refused_naming_the_key(serve, words):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=words):
        serve_recipe(serve)


def test_serve_settings_do_not_change_the_recipe_digest():
    assert serve_recipe().digest == serve_recipe({"max_batch_size": 2, "max_queue_size": 5}).digest
