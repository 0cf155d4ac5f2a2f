"""Reading data files: one function per format, each the only place that opens that format
(so a check of the file itself, e.g. size or file type, belongs at the top of each).

All raise InputError naming `where` (the recipe key and the path) and how to fix it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import pipeline.data.npz_files as npz_files
from pipeline.artifacts import json_file
from pipeline.core import safe_files
from pipeline.core.errors import InputError
from pipeline.core.text import first_line

Arrays = dict[str, np.ndarray]  # array name in the .npz -> its array

NPZ_HINT = ("write it with numpy.savez(path, <input name>=array, ...): one array per input, "
            "samples on the first axis")
JSONL_HINT = ('one JSON object a line: {"text": ...}, {"text": ..., "label": <class id>} or '
              '{"sentence1": ..., "sentence2": ..., "score": <number>}')


# A text file is read whole: one larger than this is refused rather than read into memory.
MAX_TEXT_BYTES = 1 << 30


def _missing(path: Path, where: str, what: str) -> InputError | None:
    if path.is_dir():
        return InputError(f"{where}: is a folder, not {what}")
    if not path.exists():
        return InputError(f"{where}: no such file")
    return None


def _open(path: Path, where: str, what: str):
    """The file opened for reading: a regular file (a link to one is followed, the recipe's
    paths being confined to resolved targets), never a FIFO, device or socket: those would
    block the open or never end (/dev/zero). Opened O_NONBLOCK and checked with fstat, so
    the answer is immediate and about the file that was opened."""
    problem = _missing(Path(path), where, what)
    if problem:
        raise problem
    try:
        return safe_files.open_regular(Path(path).resolve())
    except safe_files.NotRegular as e:
        raise InputError(f"{where}: is {e.what}, not {what}", "point it at a regular file") from None
    except OSError as e:
        raise InputError(f"{where}: cannot read ({e.strerror})") from None


def read_npz(path: Path, where: str, rows: int | None = None) -> Arrays:
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
    with _open(path, where, "an .npy file") as f:
        try:
            _check_npy_size(f)
            array = np.load(f, allow_pickle=False)
        except InputError:
            raise
        except Exception as e:  # a foreign or truncated file
            raise InputError(f"{where}: not a readable .npy ({first_line(e, 200, with_type=True)})",
                             "write it with numpy.save(path, array), samples on the first axis") from None
    if not isinstance(array, np.ndarray):
        raise InputError(f"{where}: holds an .npz archive, not one .npy array",
                         "give an .npz as `arrays:` with one array per input, or save one array")
    return array


def _check_npy_size(f) -> None:
    """An .npy holds its values uncompressed after the header: a header whose shape needs
    more bytes than the file has would make numpy allocate them all before failing."""
    import math
    import os

    if f.read(6) != b"\x93NUMPY":
        f.seek(0)
        return  # not an .npy (an .npz is named as such by the caller); np.load says what
    f.seek(0)
    version = np.lib.format.read_magic(f)
    shape, _, dtype = np.lib.format._read_array_header(f, version)
    needed = math.prod(shape) * dtype.itemsize
    left = os.fstat(f.fileno()).st_size - f.tell()
    f.seek(0)
    if needed > left:
        raise InputError(f"{f.name}: its header claims {shape} {dtype} ({needed:,} bytes), but "
                         f"the file holds {left:,} bytes of values; the file is truncated or forged",
                         "write it with numpy.save(path, array)")


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
            row = json_file.loads(line)  # bounded: a line nested 100,000 deep is refused, not a crash
        except json_file.Unreadable as e:
            raise InputError(f"{where}: line {n}: {e.problem}", JSONL_HINT) from None
        if not isinstance(row, dict):
            raise InputError(f"{where}: line {n} is {type(row).__name__}, not a JSON object", JSONL_HINT)
        rows.append(row)
    return rows


def _read_text(path: Path, where: str) -> str:
    import os

    with _open(path, where, "a text file") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_TEXT_BYTES:
            raise InputError(f"{where}: {size:,} bytes, more than the {MAX_TEXT_BYTES >> 20} MiB a "
                             "text source may have (it is read whole)",
                             "keep the sentences the split needs in a smaller file")
        data = f.read(MAX_TEXT_BYTES + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{where}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise InputError(f"{where}: cannot read ({e.strerror})") from None


def sha256(path: Path, where: str = "data file") -> str:
    """The data file's sha256 (the pipeline's one file digest), opened as _open opens it: a
    regular file (a link to one followed), never a FIFO or device, with one clear message."""
    what = {".npz": "an .npz file", ".npy": "an .npy file"}.get(Path(path).suffix.lower(), "a text file")
    with _open(path, where, what):
        pass
    return safe_files.sha256(Path(path).resolve())
