"""What `pipeline generate RECIPE` (cli/generate.py) talks to: a built generation engine.

`Chat` runs the deployed folder the way a user would: onnxruntime-genai on engines/<recipe>/
(genai_config.json naming the engine file, the model's tokenizer files beside it), the
model's chat template, greedy, tokens streamed as they come, stopping at end of sequence.
A conversation (--chat) is run again from its whole text each turn: genai 0.18 cannot
append a turn after generating (it fails on a concatenating cache and silently attends to an
empty slot on a shared one: runners.GenaiRunner).
"""

from __future__ import annotations

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
        from pipeline.data.tokenizer import Tokenizer

        # the model's tokenizer files ship beside the engine; a byte-level model has none
        self.tokenizer = Tokenizer.from_folder(folder, "generate") \
            if (folder / "tokenizer.json").is_file() else Tokenizer()

    def _ids(self, messages: list[dict]) -> list[int]:
        tok = self.tokenizer
        if tok.is_bytes:  # a byte-level model: UTF-8 bytes are its tokens, one message a line
            return tok.encode("".join(m["content"] + "\n" for m in messages), special_tokens=False)
        if self.raw or not tok.has_template:
            # the user's text as typed: a prompt the model continues, no sequence framing added
            return tok.encode("\n".join(m["content"] for m in messages), special_tokens=False)
        return tok.conversation(messages)

    def reply(self, messages: list[dict], max_tokens: int) -> str:
        """Generate greedily until end of sequence, printing the text as it grows (a character
        split over tokens once it is whole: data/text_stream.py, as the server streams it)."""
        import numpy as np

        from pipeline.data.text_stream import TextStream

        ids = self._ids(messages)
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(ids) + max_tokens, do_sample=False)
        generator = self.og.Generator(self.model, params)
        generator.append_tokens(np.asarray([ids], np.int32))
        text = TextStream(self.tokenizer)
        while not generator.is_done():
            generator.generate_next_token()
            sys.stdout.write(text.add(int(generator.get_next_tokens()[0])))
            sys.stdout.flush()
        sys.stdout.write(text.finish() + "\n")
        return text.text.strip()
