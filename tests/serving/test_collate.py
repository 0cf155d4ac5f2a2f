"""serving/collate.py: the checks a request must pass (one clear line each), padding to its
length bucket, stacking into a batch and cutting the answers back. No Ray, no engine."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.serving import collate
from tests.recipe.test_serve import serve_recipe


def _sig(**serve):
    r = serve_recipe(serve)
    return collate.Signature.of(r, output_axes={"hidden": {1: "sequence"}})


@pytest.mark.parametrize("inputs, words", [
    ({"input_ids": [[1, 2, 3]]}, "missing: ['attention_mask']"),
    ({"input_ids": [[1, 2]], "attention_mask": [[1, 1]], "x": [1]}, "unknown: ['x']"),
    ({"input_ids": [[1.5, 2]], "attention_mask": [[1, 1]]}, "non-integer"),
    ({"input_ids": [[1, 2], [3, 4]], "attention_mask": [[1, 1], [1, 1]]}, "batch size 2"),
    ({"input_ids": [1, 2], "attention_mask": [1, 1]}, "needs 2 dims"),
    ({"input_ids": [[1] * 40], "attention_mask": [[1] * 40]}, "2..32"),
    ({"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1]]}, "must agree"),
    ({"input_ids": [[1, [2]]], "attention_mask": [[1, 1]]}, "rectangular"),
    ({"input_ids": [["a", "b"]], "attention_mask": [[1, 1]]}, "numbers"),
])
def test_a_request_that_does_not_fit_is_one_clear_line(inputs, words):
    with pytest.raises(collate.BadRequest, match=words.replace("[", r"\[").replace("]", r"\]")):
        collate.check(_sig(), inputs)


def test_an_npz_array_must_have_the_inputs_dtype_exactly():
    arrays = {"input_ids": np.ones((1, 4), np.int32), "attention_mask": np.ones((1, 4), np.int64)}
    with pytest.raises(collate.BadRequest, match="dtype int32"):
        collate.check(_sig(), arrays)


def test_requests_are_padded_to_their_bucket_stacked_and_cut_back():
    sig = _sig(pad_values={"input_ids": 7}, length_buckets={"sequence": [8]})
    a, la = collate.check(sig, {"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1, 1]]})
    b, lb = collate.check(sig, {"input_ids": [[4, 5, 6, 7, 8]], "attention_mask": [[1] * 5]})
    assert collate.bucket(sig, la) == collate.bucket(sig, lb) == (("sequence", 8),)
    feed = collate.stack(sig, [a, b], (("sequence", 8),))
    assert feed["input_ids"].tolist() == [[1, 2, 3, 7, 7, 7, 7, 7], [4, 5, 6, 7, 8, 7, 7, 7]]
    assert feed["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1] * 5 + [0] * 3]
    hidden = np.arange(2 * 8 * 3).reshape(2, 8, 3).astype(np.float32)
    first, second = collate.split(sig, {"hidden": hidden}, [la, lb])
    assert first["hidden"].shape == (1, 3, 3) and second["hidden"].shape == (1, 5, 3)
    assert np.array_equal(second["hidden"][0], hidden[1, :5])


def test_with_batches_of_one_nothing_is_padded():
    sig = _sig(max_batch_size=1)
    _, lengths = collate.check(sig, {"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1, 1]]})
    assert collate.bucket(sig, lengths) == (("sequence", 3),)
