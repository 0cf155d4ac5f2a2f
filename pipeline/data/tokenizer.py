"""The one tokenizer wrapper: a Hugging Face tokenizer saved with save_pretrained(), or UTF-8
bytes (id = byte value, 0..255) for byte-level models that ship no tokenizer files.

Every caller says whether the tokenizer's special tokens frame the text
(`encode(text, special_tokens=...)`), since the right answer depends on what the text is:
a classifier's or an embedder's sentence wants the [CLS]/[SEP] (or <s>) it was trained with,
while a prompt that a chat template already framed, or running text cut into windows, must
not get a second beginning-of-sequence.

Where the folder comes from (a recipe's `tokenizer:`, the model's own, a deployed engine
folder) is the caller's to resolve: data/tokenize.py, generation/chat.py, commands/generate.py.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core import env
from pipeline.core.errors import InputError


class Tokenizer:
    """Text <-> token ids, one wrapper for the data feeds, the chat workload and `generate`."""

    def __init__(self, hf=None):
        """hf: a loaded transformers tokenizer; None for UTF-8 bytes (see `from_folder`)."""
        self.hf = hf

    @classmethod
    def from_folder(cls, folder: Path, where: str) -> Tokenizer:
        """The tokenizer saved in `folder` (offline); InputError naming `where` if none loads."""
        env.hf_offline()
        from transformers import AutoTokenizer

        try:
            return cls(AutoTokenizer.from_pretrained(str(folder)))
        except Exception as e:  # a folder without tokenizer files fails in several ways
            raise InputError(f"{where}: no tokenizer could be loaded from {folder} "
                             f"({type(e).__name__}: {str(e).splitlines()[0][:200]})",
                             "give a folder saved with tokenizer.save_pretrained(), or `bytes`") from None

    @property
    def is_bytes(self) -> bool:
        return self.hf is None

    @property
    def pad_id(self) -> int:
        """The id that fills a row past its end (its attention mask says so): the tokenizer's
        pad token, else 0."""
        return 0 if self.hf is None else (self.hf.pad_token_id or 0)

    @property
    def has_template(self) -> bool:
        return self.hf is not None and bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str, special_tokens: bool) -> list[int]:
        """The ids of `text`; with special_tokens, framed as the tokenizer frames a sequence
        (bytes have none)."""
        if self.hf is None:
            return list(text.encode("utf-8"))
        return self.hf(text, add_special_tokens=special_tokens)["input_ids"]

    def decode(self, ids) -> str:
        """The text of `ids`, special tokens left out; bytes outside 0..255 are dropped and a
        broken UTF-8 sequence reads as U+FFFD."""
        if self.hf is None:
            return bytes(int(i) for i in ids if 0 <= i < 256).decode("utf-8", "replace")
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=True)

    def conversation(self, messages: list[dict]) -> list[int]:
        """The ids of a conversation, ending with the prompt for the assistant's reply: the
        model's chat template, else plain `Question:`/`Answer:` lines."""
        if self.has_template:
            text = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            # the template wrote the conversation's own start and role tokens
            return self.encode(text, special_tokens=False)
        lines = [f"{'Question' if m['role'] == 'user' else 'Answer'}: {m['content']}\n" for m in messages]
        return self.encode("".join(lines) + "Answer:", special_tokens=False)

    def stop_ids(self, eos: int | None) -> set[int]:
        """Tokens that end a reply: the model's end of sequence `eos`, the tokenizer's own, and
        a byte model's newline."""
        ids = {eos} if eos is not None else set()
        if self.hf is None:
            ids.add(ord("\n"))
        elif self.hf.eos_token_id is not None:
            ids.add(int(self.hf.eos_token_id))
        return ids
