"""The DataSource interface and its five sources. A split (validation, calibration) names at
most one of `file`, `loader`, `text`, `arrays`; none means seeded random feeds.

Every source returns SplitData: the feeds plus their provenance {source, sha256, samples}
(`samples`: feeds for random, npz and loader; sentences, passages, pairs or images for text
and arrays), and labels or token masks where the data has them.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

import pipeline.data.files as files
import pipeline.data.tokenize as tokenize
from pipeline.core.errors import InputError, RecipeError
from pipeline.core.json_object import JsonObject
from pipeline.core.text import display_path, first_line
from pipeline.data.feeds import Feed, Provenance, SplitData, feeds_sha256
from pipeline.data.random_source import random_feeds
from pipeline.recipe import Recipe


class DataSource:
    """One way of producing a split's feeds. `where` names the recipe key in messages."""

    def __init__(self, recipe: Recipe, split: str):
        self.recipe, self.split = recipe, split
        self.spec = getattr(recipe.data, split)

    def load(self) -> SplitData:
        raise NotImplementedError

    def key(self) -> JsonObject:
        """What identifies the data beyond the recipe's data section (file contents)."""
        return {}


class RandomSource(DataSource):
    def load(self) -> SplitData:
        feeds, _ = random_feeds(self.recipe, self.split, self.spec.samples, self.spec.shapes)
        return SplitData(feeds, Provenance(f"random (seed {self.recipe.data.seed})",
                                           feeds_sha256(feeds), len(feeds)))


class _FileSource(DataSource):
    field = ""

    @property
    def path(self) -> Path:
        return Path(getattr(self.spec, self.field))

    @property
    def where(self) -> str:
        return f"data.{self.split}.{self.field} {display_path(self.path)}"

    def key(self) -> JsonObject:
        # a FIFO or device in its place is refused here, at once (files._open)
        return {"sha256": files.sha256(self.path, self.where)} if self.path.exists() else {}

    def provenance(self, samples: int) -> Provenance:
        return Provenance(display_path(self.path), files.sha256(self.path, self.where), samples)


class NpzSource(_FileSource):
    """Feeds as saved: one array per input with a leading sample axis, or save_feeds' keys."""

    field = "file"

    def load(self) -> SplitData:
        arrays = files.read_npz(self.path, self.where, rows=self.spec.samples)
        if arrays and all(k.startswith("in/") for k in arrays):
            feeds = _saved_feeds(arrays, self.where)
        else:
            lengths = {k: (a.shape[0] if a.ndim else None) for k, a in arrays.items()}
            if not arrays or None in lengths.values() or len(set(lengths.values())) != 1:
                got = ", ".join(f"{k} {a.shape}" for k, a in arrays.items()) or "nothing"
                raise InputError(f"{self.where}: expected one array per input with the same "
                                 f"leading sample axis, got {got}", files.NPZ_HINT)
            n = next(iter(lengths.values()))
            feeds = [{k: a[i] for k, a in arrays.items()} for i in range(n)]
        feeds = feeds[: self.spec.samples]
        return SplitData(feeds, self.provenance(len(feeds)))


def _saved_feeds(arrays: dict[str, np.ndarray], where: str) -> list[Feed]:
    """Feeds from save_feeds' layout `in/<sample index>/<input name>`, each key checked."""
    groups: dict[int, Feed] = {}
    for key, array in arrays.items():
        _, index, name = (key.split("/", 2) + ["", ""])[:3]
        if not index.isdigit() or not name:
            raise InputError(f"{where}: array `{key}` is not named in/<sample index>/<input name> "
                             "(e.g. in/0/input_ids)", files.NPZ_HINT)
        groups.setdefault(int(index), {})[name] = array
    return [groups[i] for i in sorted(groups)]


class LoaderSource(DataSource):
    """`module:function` returning a list of feeds; found beside the recipe or in the
    current directory like a model factory."""

    @property
    def where(self) -> str:
        return f"data.{self.split}.loader {self.spec.loader}"

    def load(self) -> SplitData:
        from pipeline.core import user_code

        ref, where = self.spec.loader, self.where
        module_name, _, attr = ref.partition(":")
        with user_code.exits_refused(where):  # a sys.exit() in it must not end the run as a success
            try:
                fn = getattr(user_code.import_module(module_name, self.recipe.source), attr)
                # an iterable is read only as far as `samples` (a generator may never end)
                result = list(itertools.islice(fn(), self.spec.samples))
            except Exception as e:  # the user's code may fail in any way
                raise InputError(f"{where}: failed ({first_line(e, with_type=True)})") from None
        if not result or not all(isinstance(f, dict) for f in result):
            raise InputError(f"{where}: must return a non-empty list of dicts input name -> array")
        feeds = [{k: np.asarray(v) for k, v in f.items()} for f in result]
        return SplitData(feeds, Provenance(f"loader {ref}", feeds_sha256(feeds), len(feeds)))


class TextSource(_FileSource):
    """.txt: one sentence a line. .jsonl: {"text"}, {"text", "label"} or
    {"sentence1", "sentence2", "score"} per line, one kind per file."""

    field = "text"

    def load(self) -> SplitData:
        texts, labels, kind = self._rows()
        batch = tokenize.batch_size(self.recipe, self.spec.batch)
        if self.spec.samples is not None:  # the most feeds; pairs stay whole
            per = 2 if kind == "pair" else 1
            keep = self.spec.samples * batch // per
            texts = texts[: keep * per]
            labels = labels[:keep] if labels is not None else None
        tok = tokenize.tokenizer(self.recipe, self.spec.tokenizer, self.where, self.recipe.source)
        feeds, masks, _ = tokenize.text_feeds(self.recipe, texts, tok, batch, self.where)
        samples = len(texts) // 2 if kind == "pair" else len(texts)
        pad = {tokenize.token_inputs(self.recipe, self.where)[0]: tok.pad_id}
        if feeds and "attention_mask" in feeds[0]:
            pad["attention_mask"] = 0
        return SplitData(feeds, self.provenance(samples), labels, masks, kind, pad=pad)

    def _rows(self) -> tuple[list[str], np.ndarray | None, str]:
        suffix = self.path.suffix.lower()
        if suffix == ".txt":
            texts = files.read_lines(self.path, self.where)
            return _nonempty(texts, self.where), None, "text"
        if suffix != ".jsonl":
            raise InputError(f"{self.where}: text data is a .txt (one sentence a line) or a .jsonl "
                             f"file, not {suffix or 'a file without suffix'}", files.JSONL_HINT)
        rows = _nonempty(files.read_jsonl(self.path, self.where), self.where)
        keys = set(rows[0])
        for n, row in enumerate(rows, 1):
            if set(row) != keys:
                raise InputError(f"{self.where}: line {n} has keys {sorted(row)}, the first line "
                                 f"{sorted(keys)}: one kind of row per file", files.JSONL_HINT)
        try:
            if keys == {"text"}:
                return [str(r["text"]) for r in rows], None, "text"
            if keys == {"text", "label"}:
                labels = np.array([int(r["label"]) for r in rows], dtype=np.int64)
                return [str(r["text"]) for r in rows], labels, "labeled"
            if keys == {"sentence1", "sentence2", "score"}:
                texts = [str(t) for r in rows for t in (r["sentence1"], r["sentence2"])]
                return texts, np.array([float(r["score"]) for r in rows]), "pair"
        except (TypeError, ValueError) as e:
            raise InputError(f"{self.where}: a label or score is not a number ({e})", files.JSONL_HINT) from None
        raise InputError(f"{self.where}: rows with keys {sorted(keys)} are not a known kind",
                         files.JSONL_HINT)


class ArraysSource(_FileSource):
    """Samples on the leading axis, `batch` per feed: an .npy for the one input, or an .npz
    with one array per input and optional `labels` [samples] (class ids)."""

    field = "arrays"

    def load(self) -> SplitData:
        names = [i.name for i in self.recipe.inputs]
        if self.path.suffix.lower() == ".npy":
            if len(names) != 1:
                raise RecipeError(f"{self.where}: an .npy holds one array; the recipe has inputs "
                                  f"{names}", "give an .npz with one array per input")
            arrays, labels = {names[0]: files.read_npy(self.path, self.where)}, None
        else:
            rows = None if self.spec.samples is None else \
                self.spec.samples * tokenize.batch_size(self.recipe, self.spec.batch)
            arrays = files.read_npz(self.path, self.where, rows=rows)
            labels = arrays.pop("labels", None)
        unknown = sorted(set(arrays) - set(names))
        if unknown or set(names) - set(arrays):
            raise InputError(f"{self.where}: holds arrays {sorted(arrays)}, the recipe's inputs are "
                             f"{names} (plus optional `labels`)", files.NPZ_HINT)
        counts = {a.shape[0] if a.ndim else 0 for a in arrays.values()}
        if labels is not None:
            counts.add(labels.shape[0] if labels.ndim == 1 else -1)
        if len(counts) != 1 or 0 in counts or -1 in counts:
            raise InputError(f"{self.where}: arrays (and `labels` [samples]) need one common, "
                             "non-empty leading sample axis", files.NPZ_HINT)
        n = counts.pop()
        batch = tokenize.batch_size(self.recipe, self.spec.batch)
        if self.spec.samples is not None:
            n = min(n, self.spec.samples * batch)
        feeds = [{k: a[s:min(s + batch, n)] for k, a in arrays.items()} for s in range(0, n, batch)]
        if labels is not None:
            labels = labels[:n].astype(np.int64)
        return SplitData(feeds, self.provenance(n), labels, None, "labeled" if labels is not None else "feed")


def _nonempty(rows: list, where: str) -> list:
    if not rows:
        raise InputError(f"{where}: holds no samples", "give at least one sentence or row")
    return rows


SOURCES = {"file": NpzSource, "loader": LoaderSource, "text": TextSource, "arrays": ArraysSource}


def source_for(recipe: Recipe, split: str) -> DataSource:
    spec = getattr(recipe.data, split)
    for field, cls in SOURCES.items():
        if getattr(spec, field, None) is not None:
            return cls(recipe, split)
    return RandomSource(recipe, split)
