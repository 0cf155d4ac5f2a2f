"""Real text for the generation workload (`workload.chat`): the question set, the multi-turn
scripts built from it, held-out text, and which tokenizer (data/tokenizer.py, with the chat
template) turns them into token ids.

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
from pipeline.data.tokenizer import Tokenizer

FileDigests = dict[str, str | None]  # ChatSpec file field -> its sha256 (None: missing)


@dataclass(frozen=True)
class Question:
    id: int
    question: str
    answers: tuple[str, ...]


Questions = dict[int, Question]  # question id -> the question


def questions(path: Path) -> Questions:
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


def chat_tokenizer(recipe) -> Tokenizer:
    """The tokenizer of the chat workload: `workload.chat.tokenizer` (a folder, or `bytes`:
    plain `Question:`/`Answer:` lines, no special tokens), else the model's own tokenizer and
    chat template."""
    spec = recipe.workload.chat
    if spec.tokenizer == "bytes":
        return Tokenizer()
    from pipeline.model.sources import transformers_dir

    hf = recipe.model.transformers
    folder = Path(spec.tokenizer) if spec.tokenizer else (
        transformers_dir(hf, recipe.where) if hf is not None else None)
    if folder is None:
        raise InputError(f"{recipe.where}: workload.chat needs a tokenizer: this model has "
                         "none of its own", "set workload.chat.tokenizer: bytes (byte-level "
                         "models) or a tokenizer folder")
    return Tokenizer.from_folder(folder, f"{recipe.where}: workload.chat.tokenizer")


def text_ids(tok: Tokenizer, path: Path, count: int, vocab: int) -> np.ndarray:
    """The first `count` tokens of the held-out text [count]; the text repeats if shorter
    (said in the provenance), and ids outside the model's vocabulary are refused."""
    # running text cut into windows for perplexity: no sequence start in its middle
    ids = np.asarray(tok.encode(held_out_text(path), special_tokens=False), dtype=np.int64)
    if ids.size == 0:
        raise InputError(f"workload.chat.text: {path} holds no text")
    if ids.max() >= vocab:
        raise InputError(f"workload.chat.text: token id {int(ids.max())} is outside the model's "
                         f"vocabulary ({vocab}): the tokenizer does not fit the model")
    return np.resize(ids, count)


def text_size(tok: Tokenizer, path: Path) -> int:
    return len(tok.encode(held_out_text(path), special_tokens=False))


def files_key(spec) -> FileDigests | None:
    """{field: sha256} of a ChatSpec's files (a missing file: None; data's error to name)."""
    if spec is None:
        return None
    return {name: files.sha256(path) if Path(path).is_file() else None
            for name, path in (("questions", spec.questions), ("tasks", spec.tasks), ("text", spec.text))}
