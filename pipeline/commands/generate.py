"""What `pipeline generate RECIPE` (cli/generate.py) talks to: a built generation engine.

`Chat` runs the deployed folder the way a user would: onnxruntime-genai on engines/<recipe>/
(genai_config.json naming the engine file, the model's tokenizer files beside it), the
model's chat template, greedy, tokens streamed as they come, stopping at end of sequence.
A conversation (--chat) is run again from its whole text each turn: genai 0.18 cannot
append a turn after generating (it fails on a concatenating cache and silently attends to an
empty slot on a shared one: runners.GenaiRunner).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipeline.core.errors import DependencyError, InputError


class Chat:
    """The deployed folder under onnxruntime-genai, with the model's tokenizer files."""

    def __init__(self, folder: Path, raw: bool):
        if not (folder / "genai_config.json").is_file():
            raise InputError(f"{folder}: no genai_config.json: the recipe's engine is not built "
                             "(or not validated)", "run `pipeline run RECIPE` first")
        try:
            import onnxruntime_genai as og
        except ImportError:
            raise DependencyError("`generate` needs onnxruntime-genai",
                                  "pip install onnxruntime-genai (the `cpu` extra has it)") from None
        self.og, self.raw = og, raw
        self.model = og.Model(str(folder))
        self.tokenizer = None
        if (folder / "tokenizer.json").is_file():
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(folder))

    def _ids(self, messages: list[dict]) -> list[int]:
        tok = self.tokenizer
        if tok is None:  # a byte-level model: UTF-8 bytes are its tokens
            return list("".join(m["content"] + "\n" for m in messages).encode("utf-8"))
        if self.raw or not getattr(tok, "chat_template", None):
            return tok("\n".join(m["content"] for m in messages), add_special_tokens=False)["input_ids"]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tok(text, add_special_tokens=False)["input_ids"]

    def _text(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return bytes(i for i in ids if i < 256).decode("utf-8", "replace")
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def reply(self, messages: list[dict], max_tokens: int) -> str:
        """Generate greedily until end of sequence, printing the text as it grows."""
        import numpy as np

        ids = self._ids(messages)
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(ids) + max_tokens, do_sample=False)
        generator = self.og.Generator(self.model, params)
        generator.append_tokens(np.asarray([ids], np.int32))
        out: list[int] = []
        shown = ""
        while not generator.is_done():
            generator.generate_next_token()
            out.append(int(generator.get_next_tokens()[0]))
            text = self._text(out)
            if not text.endswith("\ufffd"):  # a multi-byte character is complete
                sys.stdout.write(text[len(shown):])
                sys.stdout.flush()
                shown = text
        sys.stdout.write("\n")
        return self._text(out).strip()
