"""`pipeline verify DIR [--files-only] [--key PUB]`: is this engines folder (or each one under
DIR) what its manifest says it is? The checks are store/integrity.py's; this module prints one
line per check and fails (IntegrityError, exit 5) naming every mismatch."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.options import debug_option


@click.command("verify")
@click.argument("folder", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--files-only", is_flag=True,
              help="Check the sha256 of every file, not the tool versions and device.")
@click.option("--key", metavar="PUBKEY", default=None,
              help="Also check DIR's signed provenance against this PEM public key (or env:NAME).")
@debug_option
def verify_command(folder, files_only, key):
    """Check DIR (engines/<recipe>/, or a folder of them) against its manifest: every file's
    sha256, and the tool versions and device it was built with against this machine."""
    from pipeline.core.errors import InputError
    from pipeline.store import integrity

    public = None
    if key is not None:
        from pipeline.store import provenance

        try:
            public = provenance.load_public(key)
        except provenance.ProvenanceError as e:
            raise InputError(str(e), getattr(e, "hint", None)
                             or "pass the PEM public key `pipeline keygen` wrote (KEY.pub)") from None
    verdicts = [integrity.verify(f, not files_only, public) for f in integrity.folders(folder)]
    _show(verdicts)
    _fail_on_mismatches(verdicts)


def _show(verdicts) -> None:
    from pipeline.core.ui import out

    for v in verdicts:
        out.print(f"[bold]{v.folder}[/]")
        for c in v.checks:
            mark = "[green]✓[/]" if c.ok else "[yellow]✗ INTERRUPTED[/]" if c.interrupted else "[red]✗ MISMATCH[/]"
            out.print(f"  {mark} {c.what}: {c.detail}", soft_wrap=True)


def _fail_on_mismatches(verdicts) -> None:
    """IntegrityError naming every mismatch; the hint reruns an interrupted commit, or else
    rebuilds."""
    from pipeline.core.errors import IntegrityError

    bad = [(v.folder, c) for v in verdicts for c in v.mismatches]
    if not bad:
        return
    total = sum(len(v.checks) for v in verdicts)
    names = ", ".join(f"{folder.name}/{c.what}" for folder, c in bad)
    if all(c.interrupted for _, c in bad):
        rerun = " / ".join(f"`pipeline run {name}`" for name in dict.fromkeys(f.name for f, _ in bad))
        raise IntegrityError(f"{len(bad)} of {total} checks failed: an interrupted commit left "
                             f"{names}", f"finish it with {rerun}")
    rebuild = " / ".join(f"`pipeline run {name} --force`"
                         for name in dict.fromkeys(folder.name for folder, _ in bad))
    raise IntegrityError(f"{len(bad)} of {total} checks failed: {names}",
                         f"rebuild with {rebuild}, or use the engines only where they were built")
