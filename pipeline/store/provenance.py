"""Signed provenance of an engines folder: an in-toto statement (SLSA provenance v1) over the
manifest, in a DSSE envelope signed with an Ed25519 key.

A manifest proves that files match the digests it lists, not who wrote it: anyone who
rewrites report.json can rewrite its sha256 in manifest.json too. A signature by a key only
the builder holds (CI's secret) closes that: `pipeline sign DIR --key KEY` writes

    DIR/provenance.intoto.json   DSSE envelope {payloadType, payload (base64), signatures}
      payload: in-toto Statement v1
        subject     manifest.json and every file it records, by sha256
        predicate   SLSA provenance v1: buildDefinition (buildType, externalParameters: the
                    recipe, its sha256 and --set values; resolvedDependencies: each stage's
                    cache key, which digests its code, inputs and recipe sections, and the
                    pipeline's own source digest), runDetails (builder id, invocation,
                    tool versions and device as metadata)

and `pipeline verify DIR --key PUB` checks the signature against the public key and every
subject digest against the files. What it proves: these exact files were in the folder
when the holder of the private key signed it. What it does not: that the key holder's
build was honest, that the numbers are good (gates are recomputed separately, see
artifacts.verdicts), or that the folder is the latest build (a stale signed folder stays
validly signed).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from pipeline.artifacts import dump
from pipeline.artifacts.manifest import Manifest
from pipeline.core.json_object import JsonObject

Digests = dict[str, str]  # subject (file) name -> its sha256

ENVELOPE = "provenance.intoto.json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/engine-pipeline/engine-pipeline/run@v1"
SIGNING_KEY_ENV = "PIPELINE_SIGNING_KEY"  # the CI secret's name: the private key's PEM text


class ProvenanceError(ValueError):
    """A signature or statement that does not check out; `problem` is one line."""


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is actually signed (type and body bound)."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


def source_digest() -> str:
    """sha256 over the pipeline package's own .py files (path and content), sorted."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def builder_id() -> str:
    """The CI workflow run when in GitHub Actions, else this host (a local signer)."""
    if os.environ.get("GITHUB_ACTIONS") == "true":
        server = os.environ.get("GITHUB_SERVER_URL", "https://github.com")
        return (f"{server}/{os.environ.get('GITHUB_REPOSITORY', '')}/"
                f"{os.environ.get('GITHUB_WORKFLOW_REF', 'workflow')}")
    return f"local:{os.uname().nodename}"


def statement(folder: Path, manifest: Manifest, digest_of) -> JsonObject:
    """The in-toto statement for a folder whose manifest has been read (and verified)."""
    subjects = [{"name": "manifest.json", "digest": {"sha256": digest_of(folder / "manifest.json")}}]
    subjects += [{"name": name, "digest": {"sha256": entry.sha256}}
                 for name, entry in sorted(manifest.files.items())]
    stages = [{"name": f"stage:{sid}", "digest": {"sha256": record.key}}
              for sid, record in sorted(manifest.stages.items())]
    invocation = os.environ.get("GITHUB_RUN_ID")
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"recipe": manifest.recipe,
                                       "recipe_sha256": manifest.recipe_sha256,
                                       "recipe_overrides": manifest.recipe_overrides or []},
                "resolvedDependencies": [
                    *stages,
                    {"name": "pipeline-source", "digest": {"sha256": source_digest()},
                     **({"annotations": {"commit": os.environ["GITHUB_SHA"]}}
                        if os.environ.get("GITHUB_SHA") else {})},
                ],
            },
            "runDetails": {
                "builder": {"id": builder_id(), "version": manifest.versions},
                "metadata": {"finishedOn": manifest.updated,
                             **({"invocationId": invocation} if invocation else {})},
                "byproducts": [{"name": "device",
                                "annotations": dump(manifest.device) if manifest.device else {}}],
            },
        },
    }


# ----------------------------------------------------------------------------- keys
KEY_MAX_BYTES = 64 * 1024  # a PEM Ed25519 key is a few hundred bytes


class KeyFileRefused(ProvenanceError):
    """A key file that is not read at all (not a regular file, or a private key others can
    read); `hint` says how to fix it."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


def _key_text(key: str | Path, private: bool) -> bytes:
    """The PEM of a key file; `env:NAME` reads it from an environment variable (CI secret)."""
    if str(key).startswith("env:"):
        text = os.environ.get(str(key)[4:], "")
        if not text.strip():
            raise ProvenanceError(f"{key}: the environment variable is empty or unset")
        return text.encode()
    return _key_file(Path(key), private)


def _key_file(path: Path, private: bool) -> bytes:
    """A key file the user named. A symlink is followed (Kubernetes mounts each key of a
    secret as a link into its ..data/ folder), to a regular file only: a FIFO would block and
    a device never end (opened O_NONBLOCK, then fstat on the descriptor, so nothing is swapped
    in between). A private key others may read is refused, as ssh refuses one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ProvenanceError(f"{path}: cannot read the key ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileRefused(f"{path}: not a regular file (mode {stat.filemode(st.st_mode)})",
                                 "name the key file itself, e.g. the one `pipeline keygen` wrote")
        if private:
            _check_private_mode(path, st)
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(KEY_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > KEY_MAX_BYTES:
        raise ProvenanceError(f"{path}: {KEY_MAX_BYTES // 1024} KiB or more, not a PEM key")
    return data


def _check_private_mode(path: Path, st: os.stat_result) -> None:
    """ssh's rule (sshkey_perm_ok): a key of ours with any group or other permission is
    refused; so is one every user may read, whoever owns it (a secret mounted root-owned
    with mode 0644, Kubernetes' default). A key of another owner readable by its group is
    kept (a secret volume with fsGroup and defaultMode 0440)."""
    mode = stat.S_IMODE(st.st_mode)
    ours = st.st_uid == os.getuid()
    if (ours and mode & 0o077) or mode & 0o004:
        who = "every user" if mode & 0o004 else "its group"
        raise KeyFileRefused(f"{path}: the private key is readable by {who} (mode {mode:04o}); "
                             "refused, as ssh refuses such a key",
                             f"chmod 600 {path} (a Kubernetes secret volume: defaultMode: 0400), "
                             "or pass the key as env:NAME")


def load_private(key: str | Path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    text = _key_text(key, private=True)  # its ProvenanceError (a ValueError) as it is
    try:
        loaded = serialization.load_pem_private_key(text, password=None)
    except (ValueError, TypeError) as e:
        raise ProvenanceError(f"{key}: not an unencrypted PEM private key ({e})") from None
    if not isinstance(loaded, Ed25519PrivateKey):
        raise ProvenanceError(f"{key}: a {type(loaded).__name__}, not an Ed25519 private key")
    return loaded


def load_public(key: str | Path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    text = _key_text(key, private=False)
    try:
        loaded = serialization.load_pem_public_key(text)
    except (ValueError, TypeError) as e:
        raise ProvenanceError(f"{key}: not a PEM public key ({e})") from None
    if not isinstance(loaded, Ed25519PublicKey):
        raise ProvenanceError(f"{key}: a {type(loaded).__name__}, not an Ed25519 public key")
    return loaded


def keyid(public) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def generate(private_path: Path) -> Path:
    """A new Ed25519 key pair: PRIVATE (mode 0600, never overwritten) and PRIVATE.pub."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    public_path = private_path.with_name(private_path.name + ".pub")
    for path, data, mode in ((private_path, private, 0o600), (public_path, public, 0o644)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return public_path


# ------------------------------------------------------------------------ envelopes
def envelope(statement_: JsonObject, private) -> JsonObject:
    body = json.dumps(statement_, sort_keys=True, separators=(",", ":")).encode()
    signature = private.sign(pae(PAYLOAD_TYPE, body))
    return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(body).decode(),
            "signatures": [{"keyid": keyid(private.public_key()),
                            "sig": base64.b64encode(signature).decode()}]}


def open_envelope(data: Any, public) -> JsonObject:
    """The statement inside a DSSE envelope, once a signature by `public` checks out."""
    from cryptography.exceptions import InvalidSignature

    if not isinstance(data, dict) or data.get("payloadType") != PAYLOAD_TYPE:
        raise ProvenanceError(f"not a DSSE envelope of an in-toto statement ({PAYLOAD_TYPE})")
    try:
        body = base64.b64decode(data.get("payload", ""), validate=True)
        signatures = [base64.b64decode(s["sig"], validate=True) for s in data.get("signatures") or []]
    except (ValueError, TypeError, KeyError):
        raise ProvenanceError("the envelope's payload or signatures are not base64") from None
    for signature in signatures:
        try:
            public.verify(signature, pae(PAYLOAD_TYPE, body))
            break
        except InvalidSignature:
            continue
    else:
        raise ProvenanceError(f"no signature by key {keyid(public)[:16]}… (signed with another "
                              "key, or the statement was changed after signing)")
    from pipeline.artifacts import json_file

    try:
        found = json_file.loads(body)
    except json_file.Unreadable as e:
        raise ProvenanceError(f"the signed statement is {e.problem}") from None
    if not isinstance(found, dict) or found.get("_type") != STATEMENT_TYPE \
            or found.get("predicateType") != PREDICATE_TYPE:
        raise ProvenanceError("the signed payload is not an in-toto SLSA provenance statement")
    return found


def subject_digests(found: dict) -> Digests:
    """{name: sha256} of a signed statement's subjects (ProvenanceError when malformed)."""
    out = {}
    for s in found.get("subject") or []:
        name = s.get("name") if isinstance(s, dict) else None
        digest = (s.get("digest") or {}).get("sha256") if isinstance(s, dict) else None
        if not isinstance(name, str) or not isinstance(digest, str):
            raise ProvenanceError("a subject without a name or a sha256 digest")
        out[name] = digest
    return out
