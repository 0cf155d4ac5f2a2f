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


def speedup(ratio: float, ci95=None) -> str:
    """A speed-up (reference time / engine time) as every output writes it: `2.00x faster
    [1.90, 2.10]`, or below 1 as its inverse, `1.22x slower [1.18, 1.25]` (the interval in
    the same direction). Read it as "engine vs reference"; JSON keeps the plain numbers."""
    if ratio >= 1:
        word, x, ci = "faster", ratio, ci95
    else:
        word, x, ci = "slower", 1 / ratio, [1 / ci95[1], 1 / ci95[0]] if ci95 else None
    return f"{x:.2f}x {word}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def time_ratio_speedup(time_ratio: float, ci95=None) -> str:
    """`speedup` of B vs A from a comparison's time ratio (B time / A time, the JSON's)."""
    return speedup(1 / time_ratio, [1 / ci95[1], 1 / ci95[0]] if ci95 else None)
