"""An .npz from outside (a calibration file): headers first, then only the rows needed.

`np.load(path)[key]` decompresses a whole array before anyone can look at its shape: an
18 MB file of zeros holds 16M samples (10 GB) where a recipe wants 16, and a FIFO in its
place blocks the open forever. Here the file must be a regular one (safe_files), each
member's .npy header (shape, dtype, order) is read on its own so the caller can check it
against the recipe, and `read(name, rows)` decompresses only the first `rows` entries of
the leading axis. Object arrays (pickles) are refused at the header.
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core import safe_files

# A Fortran-ordered array cannot be read row by row; one this large is refused instead.
FORTRAN_MAX_BYTES = 256 << 20


class NpzError(Exception):
    """The file is a zip, but not an .npz of plain arrays (the message says what is wrong)."""


@dataclass(frozen=True)
class Header:
    """One member's .npy header: enough to check an array against a recipe without it."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool
    size: int = 0  # no values read yet: check_feeds' value-range check skips it

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape[1:]) * self.dtype.itemsize


Headers = dict[str, Header]  # array name (the member without `.npy`) -> its header


class Npz:
    """An open .npz: `headers()`, then `read(name, rows)`; use as a context manager."""

    def __init__(self, path: Path):
        self._file = safe_files.open_regular(path)  # NotRegular, FileNotFoundError
        try:
            self._zip = zipfile.ZipFile(self._file)
        except BaseException:
            self._file.close()
            raise
        self._headers: dict[str, tuple[zipfile.ZipInfo, Header, int]] = {}

    def __enter__(self) -> Npz:
        return self

    def __exit__(self, *exc) -> None:
        self._zip.close()
        self._file.close()

    def fileno(self) -> int:
        return self._file.fileno()

    def headers(self) -> Headers:
        """Array name (the member without `.npy`) -> its header, in the file's order."""
        for info in self._zip.infolist():
            if not info.filename.endswith(".npy"):
                raise NpzError(f"member `{info.filename}` is not an .npy array")
            name = info.filename[: -len(".npy")]
            with self._zip.open(info) as f:
                header, offset = _read_header(f, name)
            data_bytes = math.prod(header.shape) * header.dtype.itemsize
            if info.file_size != offset + data_bytes:
                raise NpzError(f"array `{name}`: its header says {header.shape} {header.dtype} "
                               f"({data_bytes:,} bytes), the member holds {info.file_size - offset:,}")
            self._headers[name] = (info, header, offset)
        return {name: header for name, (_, header, _) in self._headers.items()}

    def read(self, name: str, rows: int | None = None) -> np.ndarray:
        """The array `name`, cut to its first `rows` entries along axis 0 (all with None)."""
        info, header, offset = self._headers[name]
        count = header.shape[0] if header.shape else 1
        rows = cut = count if rows is None else min(rows, count)
        if header.fortran and len(header.shape) > 1 and rows < count:
            if math.prod(header.shape) * header.dtype.itemsize > FORTRAN_MAX_BYTES:
                raise NpzError(f"array `{name}` {header.shape} is stored in Fortran order, which "
                               "cannot be read sample by sample; save it with np.ascontiguousarray")
            rows = count
        shape = (rows, *header.shape[1:]) if header.shape else ()
        wanted = math.prod(shape) * header.dtype.itemsize
        with self._zip.open(info) as f:
            f.read(offset)
            raw = f.read(wanted)
        if len(raw) != wanted:
            raise NpzError(f"array `{name}` is cut short ({len(raw):,} of {wanted:,} bytes)")
        order = "F" if header.fortran else "C"
        array = np.frombuffer(raw, dtype=header.dtype).reshape(shape, order=order).copy()
        return array[:cut] if shape else array


def _read_header(f, name: str) -> tuple[Header, int]:
    """(header, bytes before the data) of an .npy stream positioned at its start."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(f".npy format version {version} (1.0 and 2.0 are read)")
    except ValueError as e:
        raise NpzError(f"array `{name}`: not a readable .npy header ({e})") from None
    if dtype.hasobject:
        raise NpzError(f"array `{name}` holds Python objects (a pickle), not numbers")
    return Header(tuple(shape), dtype, fortran), f.tell()
