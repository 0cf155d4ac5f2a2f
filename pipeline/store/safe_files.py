"""Files in folders that may have been planted: read only regular files, never through a
symlink, and create temporary files exclusively.

An engines folder or a data file can come from anywhere (a CI artifact, a download), so a
name in it may be a symlink to another file (`.lock` -> ~/.bashrc would be truncated), a
FIFO (an open() that never returns) or a device. Every open here is `O_NOFOLLOW` (the last
component is never followed) and `O_NONBLOCK` (a FIFO opens at once), and the opened file
must be a regular one (fstat on the descriptor, so nothing can be swapped in between).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO

_NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class NotRegular(Exception):
    """`path` is a symlink, a FIFO, a folder or a device where a regular file must be."""

    def __init__(self, path: Path, what: str):
        super().__init__(f"{path}: {what}, not a regular file")
        self.path = path
        self.what = what


def _describe(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "a special file"


def is_regular(path: Path) -> bool:
    """A regular file under this very name (a symlink to one is not)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return False


def kind(path: Path) -> str | None:
    """What `path` is when it is there but not a regular file (e.g. "a symbolic link")."""
    try:
        mode = os.lstat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else _describe(mode)


def open_fd(path: Path, flags: int, mode: int = 0o644) -> int:
    """os.open without following a final symlink; the descriptor must be a regular file.
    NotRegular otherwise; FileNotFoundError and other OSErrors pass through."""
    try:
        fd = os.open(path, flags | _NOFOLLOW, mode)
    except OSError:
        found = kind(path)
        if found is not None:  # ELOOP (a symlink), EISDIR, ENXIO (a FIFO with no writer), ...
            raise NotRegular(Path(path), found) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegular(Path(path), _describe(st.st_mode))
    os.set_blocking(fd, True)
    return fd


def open_regular(path: Path) -> BinaryIO:
    """Open a regular file for reading (see the module's docstring)."""
    return os.fdopen(open_fd(path, os.O_RDONLY), "rb")


def read_bytes(path: Path) -> bytes:
    with open_regular(path) as f:
        return f.read()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open_regular(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def create_exclusive(path: Path) -> BinaryIO:
    """A new file at `path` for writing: fails (FileExistsError) if any entry, a symlink
    included, already has that name."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    return os.fdopen(fd, "wb")


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write to a new sibling temporary file (created exclusively, random name), fsync, then
    rename over `path`. A planted `.NAME.*.tmp` (a symlink) is never written through."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            f = create_exclusive(tmp)
        except FileExistsError:
            continue
        break
    else:  # 100 random names taken: someone is filling the folder on purpose
        raise FileExistsError(f"{path.parent}: no free temporary name for {path.name}")
    try:
        with f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
