"""Small text helpers every message uses: a path as the user sees it, an exception in one line."""

from __future__ import annotations

from pathlib import Path


def display_path(path: Path) -> str:
    """`path` relative to the working directory when inside it (as the user typed it), else whole."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def first_line(e: BaseException, limit: int = 300, *, with_type: bool = False) -> str:
    """The first line of an exception's message, cut at `limit` characters; the type's name
    when the message is empty. `with_type` prefixes it (`ValueError: ...`)."""
    text = str(e).strip()
    line = text.splitlines()[0][:limit] if text else ""
    if not line:
        return type(e).__name__
    return f"{type(e).__name__}: {line}" if with_type else line


def fmt(value, spec: str = ".3f") -> str:
    """A number for a table, or an em dash when there is none."""
    return "—" if value is None else format(value, spec)
