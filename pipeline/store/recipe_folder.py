"""The artifact store: one folder per recipe, atomic writes, a manifest, a lock.

    engines/<recipe>/
        manifest.json     sha256 and size of every file, the stage records (cache keys),
                          tool versions, device, recipe digest
        model.onnx, <target>.onnx|.plan|.pt2, baseline.npz, validate-<target>.json, report.*
        .tmp/             work in progress; never read, swept at the start of a run
        .lock             held (flock) by the run that writes here

Nothing ever appears under a final name half-written: stages write into `.tmp/`, `commit()`
renames the finished file into place (atomic), the manifest the same way after its files.

A run can be killed at any instant (SIGKILL, power, CI cancel). `commit_stage()` therefore
first records the new digests under the manifest's `pending` (and drops the stage's record),
then renames the files, then records them in `files` and empties `pending`. Killed in
between, every file has either its recorded digest or its pending one: that is an
interrupted commit, not tampering, and the stage (with no record) simply reruns. Any other
digest is a file changed by hand: IntegrityError. A recorded JSON file must also still be
the object the pipeline wrote (`read_recorded_json`), since a manifest rewritten to match a
broken file passes the sha256.
Manifests and recorded JSON files are read through their models (pipeline.artifacts), a
misfit refused in one line (IntegrityError). `run --force` keeps an unreadable manifest as
manifest.json.unreadable-<time> and starts over, and replaces a planted `.lock`.

A folder may be planted (a downloaded CI artifact): the lock, the manifest and every recorded
file are opened without following symlinks and must be regular files (safe_files), temporary
files are exclusive under random names, a recorded name is one plain component (paths.NAME).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.artifacts import json_file, recorded
from pipeline.artifacts.manifest import SCHEMA, FileEntry, Manifest, StageRecord
from pipeline.core import deps, paths, safe_files
from pipeline.core.errors import InputError, IntegrityError, LockError
from pipeline.core.json_object import JsonObject

MANIFEST = "manifest.json"
ASIDE = ".unreadable-"  # --force keeps a bad manifest as manifest.json.unreadable-<time>


@dataclass(frozen=True)
class Artifact:
    """A committed file: its name in the store, where it is, and what it contains."""

    name: str
    path: Path
    sha256: str
    bytes: int


Artifacts = dict[str, Artifact]  # a stage's committed files: name in the store -> its Artifact
WorkFiles = dict[str, Path]  # a stage's files before commit: name in the store -> its work path


def _empty_manifest() -> Manifest:  # a folder's manifest before its first commit
    return Manifest.model_validate({"schema": SCHEMA, "files": {}, "stages": {}})


def sha256_file(path: Path) -> str:
    """sha256 of a regular file (safe_files.NotRegular for a symlink, FIFO, folder...)."""
    return safe_files.sha256(path)


write_atomic = safe_files.write_atomic  # exclusive random temp name, fsync, rename


def _planted(path: Path, problem: str, folder: Path) -> IntegrityError:
    return IntegrityError(f"{path}: {problem}; the pipeline never writes that, so the folder "
                          "was changed after the build",
                          f"remove it, or rebuild with `pipeline run {folder.name} --force`")


def _fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (the directory entry itself lives in the folder)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_wait() -> float:
    """Seconds a run waits for another run's lock (env PIPELINE_LOCK_WAIT, default 600)."""
    text = os.environ.get("PIPELINE_LOCK_WAIT", "600")
    with contextlib.suppress(ValueError):
        if math.isfinite(seconds := float(text)) and seconds >= 0:
            return seconds
    raise InputError(f"PIPELINE_LOCK_WAIT={text!r}: not a number of seconds",
                     "set it to seconds >= 0 (e.g. PIPELINE_LOCK_WAIT=60), or unset it for 600")


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n"


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class Store:
    def __init__(self, root: Path, recipe_name: str):
        self.dir = Path(root) / recipe_name
        self.tmp = self.dir / ".tmp"
        self._manifest: Manifest | None = None

    # ------------------------------------------------------------------ locking
    @contextlib.contextmanager
    def lock(self, wait: float | None = None, on_wait: Callable[[str], None] | None = None,
             clear_planted: bool = False) -> Iterator[None]:
        """Exclusive lock on the folder; a second run waits (up to `wait` s), then gives up."""
        f = self._open_lock(clear_planted)
        with f:
            deadline = time.monotonic() + (lock_wait() if wait is None else wait)
            told = False
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    f.seek(0)
                    holder = f.read().strip() or "another process"
                    if time.monotonic() > deadline:
                        raise LockError(
                            f"{self.dir} is locked by {holder}; another run of this recipe is "
                            f"still writing there", "wait for it to finish, then rerun"
                        ) from None
                    if on_wait and not told:
                        on_wait(f"waiting for {holder} to finish writing {self.dir}")
                        told = True
                    time.sleep(0.2)
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()}")
            f.flush()
            self._manifest = None  # read again: another process may have committed meanwhile
            try:
                self._sweep()
                yield
            finally:
                f.seek(0)
                f.truncate()
                fcntl.flock(f, fcntl.LOCK_UN)

    def _open_lock(self, clear_planted: bool = False):
        """The folder (created if need be) and its .lock file, open for writing; a folder or
        file this user may not write is named as such (not as a folder that is missing).
        clear_planted (--force): a .lock that is no regular file (never the pipeline's) is replaced."""
        try:
            safe_files.folder(self.dir.parent, self.dir.name)  # made if missing; a link: exit 5
        except OSError as e:
            where = next((p for p in (self.dir, *self.dir.parents) if p.exists()), None)
            what = (f"cannot create the output folder ({e.strerror}"
                    + (f"; {where} is not writable by this user)" if where is not None
                       and where.is_dir() and not os.access(where, os.W_OK | os.X_OK) else ")"))
            raise InputError(f"{self.dir}: {what}", "check --engines-dir / PIPELINE_ENGINES") from None
        lock = self.dir / ".lock"
        try:  # never through a symlink: a planted `.lock -> ~/file` would be truncated
            fd = safe_files.open_fd(lock, os.O_RDWR | os.O_CREAT)
            return os.fdopen(fd, "r+")
        except safe_files.NotRegular as e:
            if clear_planted:
                safe_files.remove_entry(lock)
                return self._open_lock(clear_planted=False)
            raise _planted(lock, f"the lock file is {e.what}", self.dir) from None
        except OSError as e:
            if lock.exists() and os.access(self.dir, os.W_OK | os.X_OK):
                raise InputError(f"{lock}: this user cannot open the lock file ({e.strerror})",
                                 "give this user write access to it (or remove it), then rerun") from None
            raise InputError(f"{self.dir}: the output folder exists but this user cannot write "
                             f"into it{' nor its .lock' if lock.exists() else ''} ({e.strerror})",
                             "fix its permissions or owner, or choose another --engines-dir") from None

    def check_folder(self) -> None:
        """The folder, when there, is a real folder inside its root, never a link: a link
        would carry every read, write and delete of the run to where it points."""
        if os.path.lexists(self.dir):
            safe_files.folder(self.dir.parent, self.dir.name, create=False)

    def _sweep(self) -> None:
        """Remove what a killed run left behind: .tmp/ and the temporary names of
        safe_files.TEMP_GLOBS (write_atomic's `.NAME.PID.HEX.tmp`, bench's old `.bench.tmp.png`)."""
        if self.tmp.is_symlink() or self.tmp.is_file():  # never work (or delete) through a link
            self.tmp.unlink()
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.tmp.exists():
            raise InputError(f"{self.tmp}: cannot remove what an earlier run left there (a file or "
                             "folder this user may not delete, e.g. owned by another user)",
                             "remove it as its owner, then rerun")
        safe_files.sweep_temps(self.dir)  # every temp pattern; a link itself, not its target

    # ------------------------------------------------------------------ manifest
    @property
    def manifest(self) -> Manifest:
        """The manifest as its model (checked when read): `files` (name -> FileEntry),
        `stages` (id -> StageRecord, also `stage_record`), `pending`, the recipe, versions
        and device. Changed only through the store's methods, written by `save_manifest`."""
        if self._manifest is None:
            self._manifest = self.read_manifest()
        return self._manifest

    def read_manifest(self) -> Manifest:
        path = self.dir / MANIFEST
        self.check_folder()
        if not os.path.lexists(path):
            return _empty_manifest()
        try:
            data = json_file.read(path)  # bounded: a planted file is refused, never a crash
        except json_file.Unreadable as e:
            raise IntegrityError(f"{path}: unreadable manifest ({e.problem})", self._manifest_hint()) from None
        try:
            return recorded.manifest(data)  # every key checked against artifacts.Manifest
        except recorded.Unusable as e:
            what = e.problem if e.stale else f"not a manifest this pipeline wrote ({e.problem})"
            raise IntegrityError(f"{path}: {what}", self._manifest_hint()) from None

    def _manifest_hint(self) -> str:
        return (f"rebuild with `pipeline run {self.dir.name} --force`: it keeps this manifest as "
                f"{MANIFEST}{ASIDE}<time> and starts the folder over")

    def set_aside_bad_manifest(self) -> Path | None:
        """For --force: an unreadable manifest is renamed (kept, never deleted) and the folder
        starts over with an empty one. Returns the new name, or None when it was readable."""
        path = self.dir / MANIFEST
        try:
            self.read_manifest()
            return None
        except IntegrityError:
            pass
        aside = self.dir / f"{MANIFEST}{ASIDE}{time.strftime('%Y%m%dT%H%M%S')}"
        if aside.exists():
            aside = aside.with_name(f"{aside.name}-{os.getpid()}")
        os.replace(path, aside)
        self._manifest = _empty_manifest()
        return aside

    def save_manifest(self, **fields: Any) -> None:
        """Write the manifest with `fields` (recipe, recipe_sha256, ...) set, stamped with
        the time, the tool versions and the device; checked whole by its model first."""
        data = {**recorded.dump(self.manifest), **fields, "schema": SCHEMA, "updated": now(),
                "versions": deps.versions(), "device": deps.device()}
        self._manifest = Manifest.model_validate(data)
        write_atomic(self.dir / MANIFEST, dumps(recorded.dump(self._manifest)))

    def stage_record(self, stage_id: str) -> StageRecord | None:
        """The record of stage `stage_id` as its model; None when the stage has none (never
        run here, or a commit of it was interrupted)."""
        return self.manifest.stages.get(stage_id)

    def stage_ids(self) -> list[str]:
        """The stages this folder records, in the manifest's order."""
        return list(self.manifest.stages)

    def forget_stage(self, stage_id: str) -> None:
        """Drop a stage's record (in memory, written with the next save): it counts as not
        done; its files stay where they are."""
        self.manifest.stages.pop(stage_id, None)

    def file_names(self) -> list[str]:
        """The names of every recorded file, sorted."""
        return sorted(self.manifest.files)

    # ------------------------------------------------------------------ artifacts
    def workdir(self, stage_id: str) -> Path:
        """A fresh private folder where a stage writes before its files are committed."""
        path = self.tmp / stage_id.replace(":", "-")
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def commit(self, produced: Path, name: str, stage_id: str) -> Artifact:
        """Move a finished file into place under its final name and record it."""
        final = paths.child(self.dir, name)  # ValueError: a stage named a path (a bug)
        with safe_files.open_regular(produced) as f:  # a stage's output is a regular file
            os.fsync(f.fileno())
        digest = sha256_file(produced)
        size = produced.stat().st_size
        os.replace(produced, final)
        _fsync_dir(self.dir)
        self.manifest.files[name] = FileEntry(sha256=digest, bytes=size, stage=stage_id)
        return Artifact(name, final, digest, size)

    def commit_stage(self, stage_id: str, produced: dict[str, Path], record: StageRecord,
                     **fields: Any) -> Artifacts:
        """Commit all files of one stage and its record, safe against a kill at any point.
        The record (built by pipeline.run.records) is dumped here, the one place it becomes
        the manifest's JSON, and before anything moves: a meta that cannot be written fails
        the commit while the folder is still as it was."""
        entry = StageRecord.model_validate(recorded.dump(record))  # a copy, as it will read back
        self.forget_stage(stage_id)  # until step 3 the stage counts as not done
        self.manifest.pending = {name: sha256_file(path) for name, path in produced.items()}
        self.save_manifest(**fields)  # step 1: what is about to appear
        outputs = {name: self.commit(path, name, stage_id) for name, path in produced.items()}
        self.manifest.stages[stage_id] = entry  # step 2 done: step 3
        self.manifest.pending = {}
        self.save_manifest(**fields)
        return outputs

    def artifact(self, name: str) -> Artifact:
        entry = self.manifest.files[name]
        return Artifact(name, self.dir / name, entry.sha256, entry.bytes)

    def verify(self, name: str) -> Artifact:
        """The recorded artifact, after checking the file still has its recorded sha256."""
        return self._verified(name)[0]

    def read_json(self, name: str) -> JsonObject:
        """A recorded JSON artifact (report.json, validate-<target>.json, ...), verified, as
        its model reads it (recorded.parse: every key checked, report.json migrated)."""
        return self._verified(name)[1]

    def _verified(self, name: str) -> tuple[Artifact, Any]:
        """(artifact, its JSON content or None): the file read and parsed once."""
        entry = self.manifest.files.get(name)
        if paths.name_problem(name):  # only a name from outside (a report's) can be one
            raise IntegrityError(f"{self.dir}: {paths.name_problem(name)} is named as an artifact",
                                 f"rebuild with `pipeline run {self.dir.name} --force`")
        path = self.dir / name
        if entry is None:
            raise IntegrityError(f"{path}: not recorded in {self.dir / MANIFEST}")
        if safe_files.kind(path):
            raise _planted(path, f"a recorded file is now {safe_files.kind(path)}", self.dir)
        if not path.is_file():
            raise IntegrityError(f"{path}: recorded in the manifest but missing", "rerun the recipe")
        actual = sha256_file(path)
        pending = self.manifest.pending.get(name)
        if actual == pending != entry.sha256:
            raise _interrupted(path, self.dir)
        if actual != entry.sha256:
            recorded = " or ".join(f"{d[:12]}…" for d in (entry.sha256, pending) if d)
            raise IntegrityError(
                f"{path}: sha256 {actual[:12]}… does not match the manifest's "
                f"{recorded}; the file changed after it was built",
                f"rebuild with `pipeline run {self.dir.name} --force`",
            )
        artifact = Artifact(name, path, actual, entry.bytes)
        data, problem = read_recorded_json(path)
        if problem is not None and problem.stale:  # another pipeline version's, not tampered
            raise IntegrityError(f"{path}: {problem}", f"rerun with --force: `pipeline run "
                                 f"{self.dir.name} --force` rebuilds it with this pipeline")
        if problem is not None:
            raise IntegrityError(f"{path}: {problem}, though its sha256 is the manifest's: the file "
                                 "and the manifest were changed after the build",
                                 f"rebuild with `pipeline run {self.dir.name} --force`")
        return artifact, data

    def verify_all(self) -> None:
        """Refuse the folder if any recorded file that still exists has changed."""
        for name in list(self.manifest.files):
            if os.path.lexists(self.dir / name):  # a symlink in its place is refused, not skipped
                try:
                    self.verify(name)
                except Interrupted:  # its stage has no record (commit step 1): it reruns
                    continue


# ---------------------------------------------------------------- folders as untrusted input
class Interrupted(IntegrityError):
    """A file with only the digest the manifest announced as `pending`: a commit was stopped
    between renaming it in and recording it. Such a file is never vouched for (a planted
    `pending` entry would otherwise vouch for any file): its stage reruns, and commands that
    read it (deploy) refuse it until a run has finished the commit."""


def _interrupted(path: Path, folder: Path) -> Interrupted:
    return Interrupted(f"{path}: an interrupted commit (the file has the digest announced as "
                       "pending, not the one recorded), so nothing vouches for it",
                       f"rerun `pipeline run {folder.name}` to finish it")


def read_recorded_json(path: Path) -> tuple[Any, recorded.Unusable | None]:
    """(content, problem) of a recorded file: (None, None) for a file that is not JSON; else
    the content as its model reads it (pipeline.artifacts: report.json migrated, validate-
    and versus- files checked; any other JSON file must be an object) or what makes it
    unusable."""
    if path.suffix != ".json":
        return None, None
    try:
        data = json_file.read(path)
    except json_file.Unreadable as e:
        return None, recorded.Unusable(e.problem)
    try:
        return recorded.parse(path.name, data), None
    except recorded.Unusable as e:
        return data, e
