"""Reading data files: one function per format, each the only place that opens that format
(so a check of the file itself, e.g. size or file type, belongs at the top of each).

All raise InputError naming `where` (the recipe key and the path) and how to fix it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import pipeline.data.npz_files as npz_files
from pipeline.errors import InputError
from pipeline.store import safe_files
from pipeline.text import first_line

NPZ_HINT = ("write it with numpy.savez(path, <input name>=array, ...): one array per input, "
            "samples on the first axis")
JSONL_HINT = ('one JSON object a line: {"text": ...}, {"text": ..., "label": <class id>} or '
              '{"sentence1": ..., "sentence2": ..., "score": <number>}')


def _missing(path: Path, where: str, what: str) -> InputError | None:
    if path.is_dir():
        return InputError(f"{where}: is a folder, not {what}")
    if not path.exists():
        return InputError(f"{where}: no such file")
    return None


def read_npz(path: Path, where: str, rows: int | None = None) -> dict[str, np.ndarray]:
    """The arrays of an .npz (no pickled objects), read header first (npz_files): only the
    first `rows` samples are decompressed, so a file of 16M samples costs what `rows` cost.
    Samples are the leading axis of each array, or, in save_feeds' layout (`in/<i>/<name>`,
    one member per sample and input), the members of the first `rows` indices."""
    problem = _missing(Path(path), where, "an .npz file")
    if problem:
        raise problem
    try:
        with npz_files.Npz(path) as npz:
            headers = npz.headers()
            if rows is not None and headers and all(k.startswith("in/") for k in headers):
                wanted = sorted({_index(k) for k in headers})[:rows]
                return {k: npz.read(k) for k in headers if _index(k) in wanted}
            return {k: npz.read(k, rows) for k in headers}
    except safe_files.NotRegular as e:
        raise InputError(f"{where}: is {e.what}, not an .npz file", "point it at a regular file") from None
    except npz_files.NpzError as e:
        raise InputError(f"{where}: {e}", NPZ_HINT) from None
    except Exception as e:  # truncated or foreign files fail inside zipfile/zlib/numpy in any way
        raise InputError(f"{where}: not a readable .npz ({first_line(e, 200, with_type=True)})",
                         NPZ_HINT) from None


def _index(key: str) -> int:
    """The sample index of a save_feeds member `in/<i>/<name>` (-1 when it is not one)."""
    parts = key.split("/", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else -1


def read_npy(path: Path, where: str) -> np.ndarray:
    """The one array of an .npy file (no pickled objects)."""
    problem = _missing(Path(path), where, "an .npy file")
    if problem:
        raise problem
    try:
        array = np.load(path, allow_pickle=False)
    except Exception as e:  # a foreign or truncated file
        raise InputError(f"{where}: not a readable .npy ({first_line(e, 200, with_type=True)})",
                         "write it with numpy.save(path, array), samples on the first axis") from None
    if not isinstance(array, np.ndarray):
        raise InputError(f"{where}: holds an .npz archive, not one .npy array",
                         "give an .npz as `arrays:` with one array per input, or save one array")
    return array


def read_lines(path: Path, where: str) -> list[str]:
    """A .txt file: one sentence a line, blank lines skipped."""
    return [line for line in _read_text(path, where).splitlines() if line.strip()]


def read_jsonl(path: Path, where: str) -> list[dict]:
    """A .jsonl file: one JSON object a line, blank lines skipped."""
    rows = []
    for n, line in enumerate(_read_text(path, where).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where}: line {n} is not JSON ({e.msg})", JSONL_HINT) from None
        if not isinstance(row, dict):
            raise InputError(f"{where}: line {n} is {type(row).__name__}, not a JSON object", JSONL_HINT)
        rows.append(row)
    return rows


def _read_text(path: Path, where: str) -> str:
    problem = _missing(Path(path), where, "a text file")
    if problem:
        raise problem
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{where}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise InputError(f"{where}: cannot read ({e.strerror})") from None


def sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
