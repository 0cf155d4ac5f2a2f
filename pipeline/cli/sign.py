"""The commands that check and vouch for an engines folder: `verify`, `sign`, `keygen`.

    pipeline keygen KEY              a new Ed25519 pair: KEY (private, 0600) and KEY.pub
    pipeline sign DIR --key KEY      verify DIR's files, then write DIR/provenance.intoto.json
    pipeline verify DIR [--key PUB]  the files against the manifest; with --key, the signature

KEY may be `env:NAME` (the PEM text in an environment variable, e.g. the CI secret
PIPELINE_SIGNING_KEY), so a key never has to touch the disk. Signing refuses a folder that
does not verify: a signature vouches only for files that match their manifest.
"""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.core.errors import InputError, IntegrityError


@click.command("verify")
@click.argument("folder", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--files-only", is_flag=True,
              help="Check the sha256 of every file, not the tool versions and device.")
@click.option("--key", metavar="PUBKEY", default=None,
              help="Also check DIR's signed provenance against this PEM public key (or env:NAME).")
def verify_command(folder, files_only, key):
    """Check DIR (engines/<recipe>/, or a folder of them) against its manifest: every file's
    sha256, and the tool versions and device it was built with against this machine."""
    from pipeline.store import integrity as verify

    verify.run(folder, environment=not files_only, key=key)


@click.command("sign")
@click.argument("folder", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--key", required=True, metavar="KEY",
              help="The PEM Ed25519 private key (a file, or env:NAME for an environment variable).")
def sign_command(folder, key):
    """Sign DIR (an engines/<recipe>/ folder): an in-toto SLSA provenance statement over its
    manifest and every recorded file, written to DIR/provenance.intoto.json."""
    from pipeline.core.ui import out
    from pipeline.store import integrity as verify
    from pipeline.store import provenance
    from pipeline.store.recipe_folder import MANIFEST, Store, dumps, sha256_file, write_atomic

    if not (folder / MANIFEST).is_file():
        raise InputError(f"{folder}: no {MANIFEST}", "sign an engines/<recipe>/ folder written by `pipeline run`")
    try:
        private = provenance.load_private(key)
    except provenance.ProvenanceError as e:
        raise InputError(str(e), "pass the PEM private key `pipeline keygen` wrote") from None
    verdict = verify.verify(folder, environment=False)
    if verdict.mismatches:
        raise IntegrityError(f"{folder}: not signed, it does not verify: "
                             + "; ".join(f"{c.what}: {c.detail}" for c in verdict.mismatches[:3]),
                             f"run `pipeline verify {folder}` for every check")
    store = Store(folder.parent, folder.name)
    statement = provenance.statement(folder, store.read_manifest(), sha256_file)
    write_atomic(folder / provenance.ENVELOPE, dumps(provenance.envelope(statement, private)))
    out.print(f"signed {folder / provenance.ENVELOPE}: {len(statement['subject'])} subjects, "
              f"key {provenance.keyid(private.public_key())[:16]}…", soft_wrap=True)


@click.command("keygen")
@click.argument("key", type=click.Path(dir_okay=False, path_type=Path))
def keygen_command(key):
    """Write a new Ed25519 key pair for `sign` / `verify --key`: KEY (private, mode 0600;
    keep it secret, e.g. as the CI secret PIPELINE_SIGNING_KEY) and KEY.pub (public)."""
    from pipeline.core.ui import out
    from pipeline.store import provenance

    try:
        public = provenance.generate(key)
    except FileExistsError as e:
        raise InputError(f"{e.filename}: already exists; a key is never overwritten",
                         "choose another name, or remove the old key first") from None
    except OSError as e:
        raise InputError(f"{key}: cannot write the key ({e.strerror})") from None
    out.print(f"private key {key} (keep it secret), public key {public}", soft_wrap=True)
