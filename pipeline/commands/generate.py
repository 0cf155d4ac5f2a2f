"""What `pipeline generate RECIPE` (cli/generate.py) talks to: a built generation engine.

`Chat` runs the deployed folder the way a user would: onnxruntime-genai on engines/<recipe>/
(genai_config.json naming the engine file, the model's tokenizer files beside it), the
model's chat template, greedy, tokens streamed as they come, stopping at end of sequence.
A conversation (--chat) is run again from its whole text each turn: genai 0.18 cannot
append a turn after generating (it fails on a concatenating cache and silently attends to an
empty slot on a shared one: runners.GenaiRunner).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pipeline.core.errors import DependencyError, InputError, IntegrityError
from pipeline.core.json_object import JsonObject


def checked_config(folder: Path, recipe) -> JsonObject:
    """The folder's genai_config.json, once nothing in it can choose what onnxruntime-genai loads: every recorded
    file is what the manifest records (a swapped engine, a FIFO in its place: exit 5), every
    file genai and the tokenizer read here is one of them, and genai_config.json is exactly
    what the pipeline writes for this recipe and engine (no `custom_ops_library`, no key or
    path the pipeline never writes). A folder may be a download or a colleague's copy: it
    is data, and genai would load the shared library its config names."""
    from pipeline.artifacts import json_file
    from pipeline.generation import decoder, genai_config
    from pipeline.store import integrity

    manifest = integrity.refuse_unverified(folder, "generate")
    config = folder / "genai_config.json"
    unrecorded = [n for n in ("genai_config.json", *genai_config.TOKENIZER_FILES)
                  if n not in manifest.files and os.path.lexists(folder / n)]
    if unrecorded:
        raise IntegrityError(f"{folder}: {', '.join(unrecorded)} {'is' if len(unrecorded) == 1 else 'are'} "
                             "not recorded in the manifest: the pipeline never ships that",
                             f"remove {'it' if len(unrecorded) == 1 else 'them'}, or rebuild with "
                             f"`pipeline run {folder.name} --force`")
    try:
        cfg = json_file.read(config)
    except json_file.Unreadable as e:
        raise IntegrityError(f"{config}: {e.problem}") from None
    foreign = genai_config.foreign_keys(cfg)
    if foreign or genai_config.engine_name(cfg) not in manifest.files:
        what = ", ".join(foreign[:3]) if foreign else \
            f"model.decoder.filename {genai_config.engine_name(cfg)!r} (not a file the manifest records)"
        raise IntegrityError(f"{config}: refused before onnxruntime-genai reads it: {what}",
                             f"rebuild with `pipeline run {folder.name} --force`")
    expected, _ = decoder.deployed_config(recipe, folder / genai_config.engine_name(cfg))
    if json.loads(json.dumps(expected)) != cfg:
        differ = _first_difference(json.loads(json.dumps(expected)), cfg)
        raise IntegrityError(f"{config}: not what the pipeline writes for recipe `{recipe.name}` "
                             f"(at {differ}); refused before onnxruntime-genai reads it",
                             f"give the --set values it was built with, or rebuild with "
                             f"`pipeline run {folder.name} --force`")
    return cfg


def _first_difference(want: object, have: object, where: str = "") -> str:
    """The dotted key where two JSON values first differ."""
    if isinstance(want, dict) and isinstance(have, dict):
        for key in sorted(want.keys() | have.keys()):
            if want.get(key) != have.get(key):
                return _first_difference(want.get(key), have.get(key), f"{where}.{key}" if where else key)
    return where or "the top level"


class Chat:
    """The deployed folder under onnxruntime-genai, with the model's tokenizer files."""

    def __init__(self, folder: Path, raw: bool, recipe):
        if not (folder / "genai_config.json").is_file():
            raise InputError(f"{folder}: no genai_config.json: the recipe's engine is not built "
                             "(or not validated)", "run `pipeline run RECIPE` first")
        try:
            import onnxruntime_genai as og
        except ImportError:
            raise DependencyError("`generate` needs onnxruntime-genai",
                                  "pip install onnxruntime-genai (the `cpu` extra has it)") from None
        self.og, self.raw = og, raw
        # the engine's sequence: prompt and reply together (genai refuses a longer max_length)
        self.context = checked_config(folder, recipe)["model"]["context_length"]
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
        if len(ids) >= self.context:
            raise InputError(f"the {'prompt' if len(messages) == 1 else 'conversation'} is {len(ids)} "
                             f"tokens: this engine holds {self.context} a sequence, prompt and reply "
                             "together", "shorten it, or build the recipe with a longer context")
        if len(ids) + max_tokens > self.context:
            sys.stderr.write(f"note: the reply stops at {self.context - len(ids)} tokens, where the "
                             f"engine's {self.context}-token sequence ends (--max-tokens {max_tokens})\n")
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=min(len(ids) + max_tokens, self.context), do_sample=False)
        generator = self.og.Generator(self.model, params)
        generator.append_tokens(np.asarray([ids], np.int32))
        text = TextStream(self.tokenizer)
        while not generator.is_done():
            generator.generate_next_token()
            sys.stdout.write(text.add(int(generator.get_next_tokens()[0])))
            sys.stdout.flush()
        sys.stdout.write(text.finish() + "\n")
        return text.text.strip()
