"""Feeds as data: the types, numpy dtypes of recipe dtypes, and the baseline's .npz layout.

baseline.npz holds everything an engine is judged on, so every validate stage reads the
same samples: `in/<i>/<name>` (feeds), `out/<i>/<name>` (PyTorch outputs), and for task
metrics `labels` ([samples]: class ids, or gold scores of sentence pairs) and
`mask/<i>` ([B, T] per feed, 1 = a real token, 0 = padding); the generation workload adds
the baseline's greedy tokens per request as `tokens/<label>` ([B, new tokens]).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TokensByLabel = dict[str, np.ndarray]  # request label -> the tokens generated for it

Feed = dict[str, np.ndarray]


@dataclass(frozen=True)
class Provenance:
    """Where a split's feeds came from (report.json `data`): the source in words, the
    sha256 of its file or feeds, how many samples."""

    source: str
    sha256: str | None
    samples: int


@dataclass
class SplitData:
    """One split as a data source produced it.

    feeds       what the model is run on, in order
    provenance  where the feeds came from (report.json `data`)
    labels      [samples]: class ids (accuracy) or gold similarity scores of pairs
    masks       per feed [B, T], 1 = real token (text sources); None for other sources
    kind        what a row is: "feed", "text", "pair" (rows a0 b0 a1 b1 ...), "labeled"
    pad         text sources: what each input's padding holds (input_ids: the tokenizer's
                pad id, attention_mask: 0); None for other sources
    """

    feeds: list[Feed]
    provenance: Provenance
    labels: np.ndarray | None = None
    masks: list[np.ndarray] | None = None
    kind: str = "feed"
    rows: int = field(default=0)
    pad: dict[str, int] | None = None


def numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # shipped with onnx

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def fingerprint(feed: Feed) -> str:
    h = hashlib.sha256()
    for name in sorted(feed):
        h.update(name.encode())
        h.update(str(feed[name].shape).encode())
        h.update(np.ascontiguousarray(feed[name]).tobytes())
    return h.hexdigest()


def feeds_sha256(feeds: list[Feed]) -> str:
    """One digest of a list of feeds (random or loader feeds have no file to hash)."""
    h = hashlib.sha256()
    for f in feeds:
        h.update(fingerprint(f).encode())
    return h.hexdigest()


def save_feeds(path, feeds_: list[Feed], outputs: list[Feed] | None = None,
               labels: np.ndarray | None = None, masks: list[np.ndarray] | None = None,
               tokens: dict[str, np.ndarray] | None = None) -> None:
    """Feeds, reference outputs, labels, token masks and generated tokens as one .npz
    (layout above)."""
    arrays = {f"in/{i}/{k}": v for i, f in enumerate(feeds_) for k, v in f.items()}
    for i, o in enumerate(outputs or []):
        arrays.update({f"out/{i}/{k}": v for k, v in o.items()})
    if labels is not None:
        arrays["labels"] = np.asarray(labels)
    for i, m in enumerate(masks or []):
        arrays[f"mask/{i}"] = m
    arrays.update({f"tokens/{label}": t for label, t in (tokens or {}).items()})
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_feeds(path) -> tuple[list[Feed], list[Feed]]:
    """Inverse of save_feeds: (feeds, outputs); outputs is [] when none were saved."""
    feeds_, outputs, _, _ = load_all(path)
    return feeds_, outputs


def load_all(path) -> tuple[list[Feed], list[Feed], np.ndarray | None, list[np.ndarray] | None]:
    """(feeds, outputs, labels or None, masks or None) from a save_feeds file; a file that is
    not one (damaged, or planted with its digest rewritten) is IntegrityError, one line."""
    import zipfile

    from pipeline.core.errors import IntegrityError
    from pipeline.core.text import first_line

    try:
        return _load_all(path)
    except (ValueError, KeyError, IndexError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise IntegrityError(f"{path}: not the baseline file this pipeline wrote ({first_line(e, 120)})",
                             f"rebuild with `pipeline run {Path(path).parent.name} --force`") from None


def _load_all(path) -> tuple[list[Feed], list[Feed], np.ndarray | None, list[np.ndarray] | None]:
    """save_feeds stores its arrays uncompressed (np.savez), so together they never claim more
    bytes than the file has: a file whose headers do (a planted "zip bomb" of zeros) is
    refused from its headers, before anything is decompressed or allocated."""
    import os

    import pipeline.data.npz_files as npz_files
    from pipeline.core.errors import IntegrityError

    groups: dict[str, dict[int, Feed]] = {"in": {}, "out": {}}
    masks: dict[int, np.ndarray] = {}
    labels = None
    try:
        with npz_files.Npz(path) as z:
            headers = z.headers()
            claimed = sum(int(np.prod(h.shape)) * h.dtype.itemsize for h in headers.values())
            size = os.fstat(z.fileno()).st_size
            if claimed > size:
                raise IntegrityError(
                    f"{path}: its arrays claim {claimed:,} bytes, more than the file's {size:,}; the "
                    "pipeline stores them uncompressed, so it did not write this file",
                    f"rebuild with `pipeline run {Path(path).parent.name} --force`")
            for key in headers:
                if key == "labels":
                    labels = z.read(key)
                elif key.startswith("mask/"):
                    masks[int(key.split("/", 1)[1])] = z.read(key)
                elif key.startswith("tokens/"):
                    continue  # load_tokens
                else:
                    part, index, name = key.split("/", 2)
                    groups[part].setdefault(int(index), {})[name] = z.read(key)
    except npz_files.NpzError as e:
        raise ValueError(str(e)) from None
    return ([groups["in"][i] for i in sorted(groups["in"])],
            [groups["out"][i] for i in sorted(groups["out"])],
            labels, [masks[i] for i in sorted(masks)] if masks else None)


def load_tokens(path) -> TokensByLabel:
    """The generated tokens a save_feeds file holds, by request label ({} when none)."""
    with np.load(path, allow_pickle=False) as z:
        return {key.split("/", 1)[1]: z[key] for key in z.files if key.startswith("tokens/")}


def padded_to_longest(split: SplitData) -> list[Feed]:
    """A text split's feeds, each padded on the right to the split's longest sequence, as the
    text source pads within a batch (pad id, mask 0). ONNX Runtime's histogram calibrators
    (percentile, entropy, distribution) stack every feed's activations into one array, which
    feeds of different lengths cannot be. Other splits are returned as they are."""
    lengths = {f[name].shape[-1] for f in split.feeds for name in (split.pad or {}) if name in f}
    if not split.pad or len(lengths) < 2:
        return split.feeds
    longest = max(lengths)
    out = []
    for feed in split.feeds:
        out.append({name: np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, longest - a.shape[-1])],
                                 constant_values=split.pad[name]) if name in split.pad else a
                    for name, a in feed.items()})
    return out
