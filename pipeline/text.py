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
    """A speed-up (reference time / engine time, bench.stats's convention) as every output
    writes it: `2.00x faster [1.90, 2.10]`, or below 1 as its reciprocal, `1.22x slower
    [1.18, 1.25]` (the interval turned the same way). Read it as "engine vs reference"; JSON
    keeps the plain numbers."""
    from pipeline.bench.stats import speedup_from_time_ratio

    if ratio >= 1:
        return f"{ratio:.2f}x faster" + _interval(ci95)
    slower, ci = speedup_from_time_ratio(ratio, ci95)  # engine time / reference time, above 1
    return f"{slower:.2f}x slower" + _interval(ci)


def time_ratio_speedup(time_ratio: float, ci95=None) -> str:
    """`speedup` of B vs A from a comparison's time ratio (B time / A time, the JSON's)."""
    from pipeline.bench.stats import speedup_from_time_ratio

    return speedup(*speedup_from_time_ratio(time_ratio, ci95))


def _interval(ci) -> str:
    return f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
