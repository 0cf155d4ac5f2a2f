"""Real text for the generation workload (`workload.chat`): the question set, the multi-turn
scripts built from it, held-out text, and the tokenizer + chat template that turn them into
token ids.

A question counts as answered right when the reply contains one of its accepted answers as
whole words, case and punctuation ignored ("The capital of France is Paris." for "Paris").
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import InputError
from pipeline.data import files


@dataclass(frozen=True)
class Question:
    id: int
    question: str
    answers: tuple[str, ...]


def questions(path: Path) -> dict[int, Question]:
    where = f"workload.chat.questions: {path}"
    out = {}
    for n, row in enumerate(files.read_jsonl(path, where), 1):
        q, answers = row.get("question"), row.get("answers")
        if not isinstance(q, str) or not isinstance(answers, list) or not answers \
                or not all(isinstance(a, str) and a.strip() for a in answers):
            raise InputError(f"{where}: row {n} needs `question` (text) and `answers` (a list of "
                             "accepted answers)")
        qid = row.get("id", n - 1)
        if qid in out:
            raise InputError(f"{where}: row {n}: id {qid} appears twice")
        out[qid] = Question(qid, q, tuple(answers))
    if not out:
        raise InputError(f"{where}: no questions")
    return out


def scripts(path: Path, qs: dict[int, Question], limit: int | None) -> list[list[Question]]:
    where = f"workload.chat.tasks: {path}"
    out = []
    for n, row in enumerate(files.read_jsonl(path, where), 1):
        turns = row.get("turns")
        if not isinstance(turns, list) or not turns:
            raise InputError(f"{where}: row {n} needs `turns` (a list of question ids)")
        missing = [t for t in turns if t not in qs]
        if missing:
            raise InputError(f"{where}: row {n} names question ids {missing} that "
                             "workload.chat.questions does not have")
        out.append([qs[t] for t in turns])
    return out[:limit] if limit else out


def held_out_text(path: Path) -> str:
    where = f"workload.chat.text: {path}"
    if Path(path).suffix == ".jsonl":
        rows = files.read_jsonl(path, where)
        if not all(isinstance(r.get("text"), str) for r in rows):
            raise InputError(f"{where}: every row needs `text`")
        return "\n".join(r["text"] for r in rows)
    return "\n".join(files.read_lines(path, where))


def _normal(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    return " " + re.sub(r"[^\w₀-₉]+", " ", text).strip() + " "


def correct(reply: str, accepted: tuple[str, ...]) -> bool:
    """An accepted answer appears in the reply as whole words (case, punctuation ignored)."""
    said = _normal(reply)
    return any(_normal(a) in said for a in accepted)


class ChatTokenizer:
    """Token ids of conversations and text: the model's tokenizer and chat template, or a
    byte-level stand-in (`bytes`: plain `Question:`/`Answer:` lines, no special tokens)."""

    def __init__(self, recipe):
        spec = recipe.workload.chat
        self.tok = None
        if spec.tokenizer != "bytes":
            import os

            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from transformers import AutoTokenizer

            from pipeline.model.sources import transformers_dir

            hf = recipe.model.transformers
            folder = Path(spec.tokenizer) if spec.tokenizer else (
                transformers_dir(hf, recipe.where) if hf is not None else None)
            if folder is None:
                raise InputError(f"{recipe.where}: workload.chat needs a tokenizer: this model has "
                                 "none of its own", "set workload.chat.tokenizer: bytes (byte-level "
                                 "models) or a tokenizer folder")
            self.tok = AutoTokenizer.from_pretrained(str(folder))

    @property
    def has_template(self) -> bool:
        return self.tok is not None and bool(getattr(self.tok, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        if self.tok is None:
            return list(text.encode("utf-8"))
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids) -> str:
        if self.tok is None:
            return bytes(int(i) for i in ids if 0 <= i < 256).decode("utf-8", "replace")
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def conversation(self, messages: list[dict]) -> list[int]:
        """The ids of a conversation, ending with the prompt for the assistant's reply."""
        if self.has_template:
            text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return self.tok(text, add_special_tokens=False)["input_ids"]
        lines = [f"{'Question' if m['role'] == 'user' else 'Answer'}: {m['content']}\n" for m in messages]
        return self.encode("".join(lines) + "Answer:")

    def stop_ids(self, eos: int | None) -> set[int]:
        """Tokens that end a reply: the model's end of sequence (and a byte model's newline)."""
        ids = {eos} if eos is not None else set()
        if self.tok is None:
            ids.add(ord("\n"))
        elif self.tok.eos_token_id is not None:
            ids.add(int(self.tok.eos_token_id))
        return ids


def text_ids(tok: ChatTokenizer, path: Path, count: int, vocab: int) -> np.ndarray:
    """The first `count` tokens of the held-out text [count]; the text repeats if shorter
    (said in the provenance), and ids outside the model's vocabulary are refused."""
    ids = np.asarray(tok.encode(held_out_text(path)), dtype=np.int64)
    if ids.size == 0:
        raise InputError(f"workload.chat.text: {path} holds no text")
    if ids.max() >= vocab:
        raise InputError(f"workload.chat.text: token id {int(ids.max())} is outside the model's "
                         f"vocabulary ({vocab}): the tokenizer does not fit the model")
    return np.resize(ids, count)


def text_size(tok: ChatTokenizer, path: Path) -> int:
    return len(tok.encode(held_out_text(path)))


def files_key(spec) -> dict | None:
    """{field: sha256} of a ChatSpec's files (a missing file: None; data's error to name)."""
    if spec is None:
        return None
    return {name: files.sha256(path) if Path(path).is_file() else None
            for name, path in (("questions", spec.questions), ("tasks", spec.tasks), ("text", spec.text))}
