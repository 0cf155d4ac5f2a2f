"""`pipeline keygen KEY`: a new Ed25519 pair, KEY (private, 0600) and KEY.pub, for `pipeline
sign` and `pipeline verify --key` (store/provenance.py writes them; a key is never
overwritten)."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.options import debug_option


@click.command("keygen")
@click.argument("key", type=click.Path(dir_okay=False, path_type=Path))
@debug_option
def keygen_command(key):
    """Write a new Ed25519 key pair for `sign` / `verify --key`: KEY (private, mode 0600;
    keep it secret, e.g. as the CI secret PIPELINE_SIGNING_KEY) and KEY.pub (public)."""
    from pipeline.core.errors import InputError
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
