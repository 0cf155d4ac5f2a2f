"""Progress and messages on stderr (stdout stays for results people pipe elsewhere)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from rich.console import Console

from pipeline.core.text import escape  # markup and control characters

console = Console(stderr=True, highlight=False)
# stdout: tables and results; wide enough for the summary table when piped to a file or CI log
out = Console(highlight=False, width=None if sys.stdout.isatty() else 150)


class Progress:
    """One line per stage: a spinner while it works, then its time, or `cached`."""

    def __init__(self, verbose: bool = False):
        self.verbose = verbose

    @contextlib.contextmanager
    def stage(self, label: str) -> Iterator[None]:
        with console.status(f"[bold]{label}[/] …", spinner="dots"):
            yield

    def done(self, label: str, seconds: float, detail: str = "") -> None:
        extra = f"  [dim]{detail}[/]" if detail else ""
        console.print(f"[green]✓[/] {label:<24} {seconds:7.1f} s{extra}")

    def cached(self, label: str) -> None:
        console.print(f"[dim]· {label:<24}  cached (inputs unchanged)[/]")

    def skipped(self, label: str, reason: str) -> None:
        console.print(f"[yellow]-[/] {label:<24}  skipped: {escape(reason)}")

    def failed(self, label: str, reason: str) -> None:
        console.print(f"[red]✗[/] {label:<24}  failed: {escape(reason)}")

    def note(self, message: str) -> None:
        console.print(f"  {message}")
