"""`pipeline sign DIR --key KEY`: verify DIR's files, then write DIR/provenance.intoto.json.

KEY may be `env:NAME` (the PEM text in an environment variable, e.g. the CI secret
PIPELINE_SIGNING_KEY), so a key never has to touch the disk. A key file may be a symlink (a
Kubernetes secret volume's are) to a regular file; one that other users may read is refused,
as ssh refuses it (`chmod 600 KEY`). Signing refuses a folder that
does not verify: a signature vouches only for files that match their manifest. `pipeline
keygen` (cli/keygen.py) writes the key pair; `pipeline verify DIR --key PUB` checks it.
"""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.options import debug_option


@click.command("sign")
@click.argument("folder", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--key", required=True, metavar="KEY",
              help="The PEM Ed25519 private key (a file of mode 600, or env:NAME for an "
              "environment variable).")
@debug_option
def sign_command(folder, key):
    """Sign DIR (an engines/<recipe>/ folder): an in-toto SLSA provenance statement over its
    manifest and every recorded file, written to DIR/provenance.intoto.json."""
    from pipeline.core.errors import InputError, IntegrityError
    from pipeline.core.ui import out
    from pipeline.store import integrity, provenance
    from pipeline.store.recipe_folder import MANIFEST, Store, dumps, sha256_file, write_atomic

    if not (folder / MANIFEST).is_file():
        raise InputError(f"{folder}: no {MANIFEST}", "sign an engines/<recipe>/ folder written by `pipeline run`")
    try:
        private = provenance.load_private(key)
    except provenance.ProvenanceError as e:
        raise InputError(str(e), getattr(e, "hint", None)
                         or "pass the PEM private key `pipeline keygen` wrote") from None
    verdict = integrity.verify(folder, environment=False)
    if verdict.mismatches:
        raise IntegrityError(f"{folder}: not signed, it does not verify: "
                             + "; ".join(f"{c.what}: {c.detail}" for c in verdict.mismatches[:3]),
                             f"run `pipeline verify {folder}` for every check")
    store = Store(folder.parent, folder.name)
    statement = provenance.statement(folder, store.read_manifest(), sha256_file)
    write_atomic(folder / provenance.ENVELOPE, dumps(provenance.envelope(statement, private)))
    out.print(f"signed {folder / provenance.ENVELOPE}: {len(statement['subject'])} subjects, "
              f"key {provenance.keyid(private.public_key())[:16]}…", soft_wrap=True)
