"""Files in folders that may have been planted: read only regular files, never through a
symlink, and create temporary files exclusively.

One rule for every file the pipeline writes or deletes inside a folder (the store's, a
compare or bench output, a deploy repository):
  - the folder itself is a real folder, never a link (`folder()`: each name below the
    root the user chose is checked with lstat, created if missing);
  - new files are created `O_EXCL | O_NOFOLLOW` under random temporary names and renamed
    into place (`write_atomic`, `write_atomic_with`), so a planted name is never written
    through;
  - no file with more than one link is written or truncated (`open_fd` for writing), since
    a hard link planted in the folder would carry the write to a file outside it;
  - temporary names left by a killed run, of every pattern the pipeline uses (TEMP_GLOBS),
    are removed without following links (`sweep_temps`).

An engines folder or a data file can come from anywhere (a CI artifact, a download), so a
name in it may be a symlink to another file (`.lock` -> ~/.bashrc would be truncated), a
FIFO (an open() that never returns) or a device. Every open here is `O_NOFOLLOW` (the last
component is never followed) and `O_NONBLOCK` (a FIFO opens at once), and the opened file
must be a regular one (fstat on the descriptor, so nothing can be swapped in between).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from pipeline.core.errors import IntegrityError

_NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


# Temporary names the pipeline writes in a folder: write_atomic's `.NAME.<pid>.<hex>.tmp`,
# and `.NAME.tmp.EXT` of earlier versions (bench's `.bench.tmp.png`).
TEMP_GLOBS = (".*.tmp", ".*.tmp.*")


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
    if flags & (os.O_WRONLY | os.O_RDWR) and st.st_nlink > 1:
        # a hard link planted in the folder: writing it would write the file it shares
        os.close(fd)
        raise NotRegular(Path(path), f"a file with {st.st_nlink} hard links")
    os.set_blocking(fd, True)
    return fd


def remove_entry(path: Path) -> None:
    """Remove `path` itself: a link, FIFO or file is unlinked (a link's target untouched), a
    real folder removed with what is in it (rmtree follows no link inside)."""
    if stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def open_regular(path: Path) -> BinaryIO:
    """Open a regular file for reading (see the module's docstring)."""
    return os.fdopen(open_fd(path, os.O_RDONLY), "rb")


def read_bytes(path: Path) -> bytes:
    with open_regular(path) as f:
        return f.read()


def sha256(path: Path, *, regular_only: bool = True) -> str:
    """The file's sha256, read in 1 MiB chunks: the one file digest of the pipeline. A
    recorded file must be a regular file (open_regular); `regular_only=False` for the user's
    own data files, which may be links into a data folder."""
    h = hashlib.sha256()
    with (open_regular(path) if regular_only else open(path, "rb")) as f:
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
    payload = data.encode() if isinstance(data, str) else data
    write_atomic_with(path, lambda f: f.write(payload))


def write_atomic_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """write_atomic for a writer that takes a binary file (a plot's savefig, np.savez)."""
    path.parent.mkdir(parents=True, exist_ok=True)
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
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def folder(root: Path, *names: str, create: bool = True) -> Path:
    """root/names...: every folder below `root` (the one the user chose: --engines-dir,
    --triton) checked with lstat to be a real folder, never a link, and created when missing
    (unless `create`; a missing one is then fine, it is made later the same way).
    IntegrityError (exit 5) for a link, a file or a device in the way."""
    path = Path(root)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = path / name
        if create:
            with contextlib.suppress(FileExistsError):
                path.mkdir()
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            if create:
                raise
            return Path(root).joinpath(*names)
        if not stat.S_ISDIR(mode):
            raise IntegrityError(
                f"{path}: is {_describe(mode)}, not a folder; the pipeline writes only into real "
                "folders (a link would carry its writes and deletes elsewhere)",
                "remove it (the link only, not what it points to), then rerun")
    return path


def sweep_temps(where: Path) -> None:
    """Remove the temporary names (TEMP_GLOBS) a killed run left in `where`: regular files
    and links (the link itself, never what it points to); folders and others are left."""
    for pattern in TEMP_GLOBS:
        for stray in where.glob(pattern):
            with contextlib.suppress(FileNotFoundError):
                mode = os.lstat(stray).st_mode
                if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
                    stray.unlink()
