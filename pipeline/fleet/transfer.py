"""An engine folder as bytes that travel through Ray's object store, and its acceptance.

No shared filesystem is assumed: a worker packs the folder it built (manifest.json and every
file the manifest records, nothing else: no lock, no work folder) into a `Packed` value;
the driver checks it against its own manifest before a byte lands in the store:

  - the manifest parses as this pipeline's manifest (pipeline.artifacts), with nothing
    `pending` (an interrupted commit is not a result);
  - the files are exactly the recorded ones, each with its recorded size and sha256.

Only then is it written, into a hidden folder beside its destination, checked once more by
the store itself (Store.verify_all: recorded JSON files must still be what the pipeline
wrote), and renamed into place whole; the folder it replaces is kept until that rename
succeeded. A refused transfer raises IntegrityError and leaves the store as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.artifacts import recorded
from pipeline.artifacts.manifest import Manifest
from pipeline.core import paths
from pipeline.core.errors import IntegrityError
from pipeline.store.recipe_folder import MANIFEST, Store


@dataclass
class Packed:
    """One engine folder in memory: its manifest's bytes and each recorded file's bytes."""

    folder: str  # the folder's name where it was built (the recipe's)
    manifest: bytes
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.manifest) + sum(len(b) for b in self.files.values())


def _manifest(packed: Packed, where: str) -> Manifest:
    try:
        return recorded.manifest(json.loads(packed.manifest))
    except (ValueError, recorded.Unusable) as e:
        raise IntegrityError(f"{where}: the manifest that came back is unusable "
                             f"({str(e).splitlines()[0]})", "the job is retried") from None


def pack(folder: Path) -> Packed:
    """Read a finished engine folder: its manifest and the files it records."""
    packed = Packed(folder.name, (folder / MANIFEST).read_bytes())
    for name in _manifest(packed, str(folder)).files:
        packed.files[name] = (folder / name).read_bytes()
    return packed


def check(packed: Packed, where: str) -> Manifest:
    """The manifest of `packed` once every file is the one it records; else IntegrityError."""
    manifest = _manifest(packed, where)
    if manifest.pending:
        raise IntegrityError(f"{where}: the folder came back with an interrupted commit "
                             f"({', '.join(sorted(manifest.pending))})", "the job is retried")
    recorded_names, sent = set(manifest.files), set(packed.files)
    if recorded_names != sent:
        extra, missing = sorted(sent - recorded_names), sorted(recorded_names - sent)
        raise IntegrityError(f"{where}: the files that came back are not the recorded ones "
                             f"(missing {missing or 'none'}, unrecorded {extra or 'none'})",
                             "the job is retried")
    for name, data in packed.files.items():
        entry = manifest.files[name]
        if paths.name_problem(name):
            raise IntegrityError(f"{where}: {paths.name_problem(name)} is named as an artifact")
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != entry.bytes or digest != entry.sha256:
            raise IntegrityError(f"{where}/{name}: sha256 {digest[:12]}… ({len(data)} bytes) does not "
                                 f"match the manifest's {entry.sha256[:12]}… ({entry.bytes} "
                                 "bytes): the transfer is corrupt", "the job is retried")
    return manifest


def unpack(packed: Packed, destination: Path) -> None:
    """Write `packed` as the folder `destination` (which must not exist yet), unchecked: for
    a worker's seed, which the stage cache verifies file by file before it reuses any."""
    destination.mkdir(parents=True)
    for name, data in packed.files.items():
        (destination / name).write_bytes(data)
    (destination / MANIFEST).write_bytes(packed.manifest)


def accept(packed: Packed, destination: Path, where: str) -> None:
    """Check `packed` and install it as `destination`, whole or not at all."""
    check(packed, where)
    destination.parent.mkdir(parents=True, exist_ok=True)
    token = f"{os.getpid()}.{uuid.uuid4().hex[:8]}"
    incoming = destination.parent / f".{destination.name}.{token}.incoming"
    old = destination.parent / f".{destination.name}.{token}.old"
    try:
        unpack(packed, incoming)
        Store(incoming.parent, incoming.name).verify_all()  # the store's own reading of it
        if destination.exists():
            destination.rename(old)
        incoming.rename(destination)
    except BaseException:
        if old.exists() and not destination.exists():
            old.rename(destination)  # the accepted folder before this one stays
        raise
    finally:
        shutil.rmtree(incoming, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
