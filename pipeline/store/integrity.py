"""Is this folder of engines what its manifest says it is? (`pipeline verify DIR`, serving's
refusal of a folder, and `pipeline sign`'s precondition.)

Checks, for an engines/<recipe>/ folder (a CI artifact, a copy on a server):
  - every file recorded in manifest.json still has its sha256 and size;
  - each built engine in report.json is the file the manifest records (same sha256);
  - the tool versions and the device recorded at build time are this machine's (a TensorRT
    plan only runs on the GPU and TensorRT version it was built for; an ORT engine saved at
    optimization level `all` is tied to the CPU's instruction set).
Every check is one `Check`; the command (cli/verify.py) prints them and fails (IntegrityError,
exit 5) on any mismatch.
A file with the digest the manifest announced as `pending` was renamed in by a commit that
was killed: it is named as an interrupted commit (rerun to finish it), not as tampering.
Nothing is followed out of the folder: a symlink, FIFO or folder where a recorded file
should be is a mismatch, and so is a report target that is not a plain name, or an engine
whose bytes are not of the kind the report records (artifacts/engine_format.py).
With a public key (`--key`), the folder's signed provenance (store/provenance.py) is checked
too: signed by that key, and every signed digest the file that is here now.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.artifacts import dump
from pipeline.artifacts.manifest import FileEntry, Manifest
from pipeline.core import deps, paths, safe_files
from pipeline.core.errors import InputError, IntegrityError
from pipeline.store.recipe_folder import MANIFEST, Store, read_recorded_json, sha256_file


@dataclass
class Check:
    what: str  # e.g. "onnxruntime.onnx" or "versions.torch"
    ok: bool
    detail: str
    interrupted: bool = False  # the file a killed commit renamed in: rerun, not rebuild


@dataclass
class Verdict:
    folder: Path
    checks: list[Check] = field(default_factory=list)

    @property
    def mismatches(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


def folders(path: Path) -> list[Path]:
    """DIR itself when it holds a manifest, else each subfolder that does (e.g. engines/)."""
    if (path / MANIFEST).is_file():
        return [path]
    found = sorted(p.parent for p in path.glob(f"*/{MANIFEST}")) if path.is_dir() else []
    if not found:
        raise InputError(f"{path}: no {MANIFEST} here or in its subfolders",
                         "point at an engines/<recipe>/ folder written by `pipeline run`")
    return found


# A commit that lands while a folder is checked (another `pipeline serve` recording its cold
# start, under the folder's lock) can replace a file after the check read the manifest: the
# file then differs from the manifest read, never from the one on disk. Commits rewrite the
# manifest (renamed into place) before they move a file, so a mismatch found while the
# manifest changed is checked again, up to this many times in all.
CHECK_ATTEMPTS = 3


def verify(folder: Path, environment: bool = True, public_key=None) -> Verdict:
    """Every check of `folder` (see the module docstring), against one state of it: checked
    again while a commit changed the manifest under the check (CHECK_ATTEMPTS)."""
    for _ in range(CHECK_ATTEMPTS):
        before = _manifest_stamp(folder)
        verdict = _verify_once(folder, environment, public_key)
        if not verdict.mismatches or _manifest_stamp(folder) == before:
            return verdict
    return verdict


def _manifest_stamp(folder: Path) -> tuple[int, int, int] | None:
    """What changes whenever the manifest is written (write_atomic: a new file renamed in)."""
    try:
        st = os.stat(folder / MANIFEST, follow_symlinks=False)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _verify_once(folder: Path, environment: bool, public_key) -> Verdict:
    store = Store(folder.parent, folder.name)
    verdict = Verdict(folder)
    try:
        manifest = store.read_manifest()
    except IntegrityError as e:  # one failed check; the other folders are still verified
        verdict.checks.append(Check(MANIFEST, False, str(e)))
        return verdict
    verdict.checks += _files(folder, manifest.files, manifest.pending)
    verdict.checks += _report(folder, manifest.files)
    if environment:
        verdict.checks += _environment(manifest)
    if public_key is not None:
        verdict.checks.append(_signature(folder, manifest, public_key))
    return verdict


def refuse_unverified(folder: Path, command: str, environment: bool = False) -> Manifest:
    """The folder's manifest, once every recorded file is what it records (`pipeline verify
    --files-only`, or with the environment too); else IntegrityError (exit 5) in one line.
    Every reader that hands the folder to a library (onnxruntime-genai, a runtime) calls this
    first: a swapped engine, a FIFO in its place or a planted config never reaches it."""
    verdict = verify(folder, environment=environment)
    bad = verdict.mismatches
    if bad:
        names = ", ".join(f"{c.what} ({c.detail})" for c in bad[:4]) + (" ..." if len(bad) > 4 else "")
        raise IntegrityError(f"{folder}: `{command}` refuses it, as `pipeline verify` does: {len(bad)} "
                             f"of {len(verdict.checks)} checks failed: {names}",
                             f"rebuild with `pipeline run {folder.name} --force`")
    return Store(folder.parent, folder.name).read_manifest()


def _signature(folder: Path, manifest: Manifest, public_key) -> Check:
    """The folder's signed provenance (pipeline.store.provenance): signed by this key, and every
    subject (manifest.json, each recorded file) the file that is here now."""
    from pipeline.artifacts import json_file
    from pipeline.store import provenance

    what = provenance.ENVELOPE
    if not (folder / what).exists() and not safe_files.kind(folder / what):
        return Check(what, False, "missing: the folder is not signed (`pipeline sign`)")
    try:
        signed = provenance.subject_digests(
            provenance.open_envelope(json_file.read(folder / what), public_key))
    except (json_file.Unreadable, provenance.ProvenanceError) as e:
        return Check(what, False, str(e).replace("\n", " "))
    here = {"manifest.json": sha256_file(folder / MANIFEST),
            **{name: entry.sha256 for name, entry in manifest.files.items()}}
    differ = sorted(n for n in signed.keys() | here.keys() if signed.get(n) != here.get(n))
    if differ:
        return Check(what, False, f"signed, but {', '.join(differ[:5])} "
                     f"{'differ' if len(differ) > 1 else 'differs'} from what was signed "
                     f"(changed or rebuilt after signing)")
    return Check(what, True, f"signed by key {provenance.keyid(public_key)[:16]}…, "
                 f"{len(signed)} subjects match")


def _files(folder: Path, files: dict[str, FileEntry], pending: dict[str, str]) -> list[Check]:
    if not files and not pending:
        return [Check(MANIFEST, False, "records no files")]
    checks = []
    for name in pending.keys() - files.keys():  # a first commit of this file, killed
        if (folder / name).is_file() and sha256_file(folder / name) == pending[name]:
            checks.append(Check(name, False, _INTERRUPTED.format(recipe=folder.name), True))
    for name, entry in files.items():
        path = folder / name
        if safe_files.kind(path):
            checks.append(Check(name, False, f"is {safe_files.kind(path)}, not the regular file "
                                             "the manifest records"))
            continue
        if not path.is_file():
            checks.append(Check(name, False, "missing (recorded in the manifest)"))
            continue
        actual, size = sha256_file(path), path.stat().st_size
        if actual == pending.get(name) != entry.sha256:
            checks.append(Check(name, False, _INTERRUPTED.format(recipe=folder.name), True))
        elif actual != entry.sha256:
            checks.append(Check(name, False, f"sha256 {actual[:16]}… does not match the manifest's "
                                             f"{entry.sha256[:16]}… ({size} vs {entry.bytes} bytes)"))
        elif problem := read_recorded_json(path)[1]:  # the manifest was rewritten to match a broken file
            checks.append(Check(name, False, f"sha256 matches the manifest, but the file is {problem}"))
        else:
            checks.append(Check(name, True, f"sha256 {actual[:16]}…, {size} bytes"))
    return checks


_INTERRUPTED = ("interrupted commit: a run was stopped while renaming this file into place (not "
                "tampering); `pipeline run {recipe}` finishes it")


def _report(folder: Path, files: dict[str, FileEntry]) -> list[Check]:
    """The engines the report vouches for are the files the manifest records."""
    path = folder / "report.json"
    if "report.json" not in files or not path.is_file():
        return []
    report, problem = read_recorded_json(path)
    if problem:
        return []  # a broken report.json is already named by the check of its file
    engines = report["engines"]
    checks = []
    for e in engines:
        if paths.name_problem(e["target"]):  # it would become a folder name in `deploy`
            checks.append(Check("report.json", False, f"engine target {paths.name_problem(e['target'])}"))
            continue
        if e.get("status") != "built" or not isinstance(e.get("path"), str) or not e["path"]:
            continue
        name = Path(e["path"]).name
        recorded = files[name].sha256 if name in files else None
        ok = recorded == e.get("sha256")
        wrong_format = ok and _format_problem(e["kind"], folder / name)
        if wrong_format:  # the report's kind names the Triton platform deploy would use
            checks.append(Check(f"report.json:{e['target']}", False, wrong_format))
            continue
        checks.append(Check(f"report.json:{e['target']}", ok,
                            f"engine {name} sha256 matches the manifest" if ok else
                            f"reports engine {name} with sha256 {str(e.get('sha256'))[:16]}…, "
                            f"the manifest records {str(recorded)[:16]}…"))
    return checks


def _format_problem(kind: str, path: Path) -> str | None:
    from pipeline.artifacts import engine_format

    try:
        return engine_format.mismatch(kind, path)
    except (OSError, safe_files.NotRegular):
        return None  # the file's own check names it


def _environment(manifest: Manifest) -> list[Check]:
    checks = []
    built_on = dump(manifest.device) if manifest.device else {}
    for block, recorded, current in (("versions", manifest.versions, deps.versions()),
                                     ("device", built_on, deps.device())):
        for key in sorted(set(recorded) | set(current)):
            built, here = recorded.get(key), current.get(key)
            checks.append(Check(f"{block}.{key}", built == here,
                                f"{built}" if built == here else
                                f"built with {built}, this machine has {here}"))
    return checks

