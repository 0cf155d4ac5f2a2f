"""`pipeline generate RECIPE [--prompt TEXT | --chat]`: talk to a built generation engine.

It runs the deployed folder the way a user would: onnxruntime-genai on engines/<recipe>/
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

import click

from pipeline.cli.options import debug_option, engines_dir_option
from pipeline.core.errors import DependencyError, InputError


@click.command("generate")
@click.argument("recipe")
@click.option("--prompt", default=None, help="One message; the reply is printed as it is generated.")
@click.option("--chat", "interactive", is_flag=True, help="A conversation: one message a line on stdin.")
@click.option("--max-tokens", type=click.IntRange(1), default=256, show_default=True,
              help="Most tokens a reply may take.")
@click.option("--raw", is_flag=True, help="Feed the text as is, without the chat template.")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="The --set values the engine was built with.")
@engines_dir_option()
@debug_option
def generate_command(recipe, prompt, interactive, max_tokens, raw, overrides, engines_dir):
    """Generate with RECIPE's built engine through onnxruntime-genai (chat template, greedy)."""
    from pipeline.store import folder_names as folders

    if (prompt is None) == (not interactive):
        raise click.UsageError("give --prompt TEXT or --chat")
    r = folders.load(recipe, tuple(overrides), Path(engines_dir))
    if r.workload.served_as != "generate":
        raise InputError(f"{r.where}: `generate` needs a generation recipe (workload.kind: "
                         f"generation), not {r.workload.kind}")
    folder = Path(engines_dir) / folders.folder_name(r)
    chat = Chat(folder, raw)
    if prompt is not None:
        chat.reply([{"role": "user", "content": prompt}], max_tokens)
        return
    messages: list[dict] = []
    for line in sys.stdin:
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.strip()})
        messages.append({"role": "assistant", "content": chat.reply(messages, max_tokens)})


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
