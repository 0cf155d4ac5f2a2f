"""Small text helpers every message uses: a path as the user sees it, an exception in one line,
text from a file made safe for a terminal."""

from __future__ import annotations

import re
from pathlib import Path

# C0 controls, DEL and C1 controls: ESC starts terminal commands (`ESC[2J` clears the screen),
# so text that came from a file (a report's `reason`, a target name) never reaches a
# terminal with them raw.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: object) -> str:
    """`text` with every control character written as its escape (`\\x1b`), newlines included."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def escape(text: object) -> str:
    """`printable(text)`, with rich's markup escaped too: for any text from a file that a
    rich console prints."""
    from rich.markup import escape as markup_escape

    return markup_escape(printable(text))


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
    """A speed-up (reference time / engine time, core.stats's convention) as every output
    writes it: `2.00x faster [1.90, 2.10]`, or below 1 as its reciprocal, `1.22x slower
    [1.18, 1.25]` (the interval turned the same way). Read it as "engine vs reference"; JSON
    keeps the plain numbers."""
    from pipeline.core.stats import speedup_from_time_ratio

    if ratio >= 1:
        return f"{ratio:.2f}x faster" + _interval(ci95)
    slower, ci = speedup_from_time_ratio(ratio, ci95)  # engine time / reference time, above 1
    return f"{slower:.2f}x slower" + _interval(ci)


def time_ratio_speedup(time_ratio: float, ci95=None) -> str:
    """`speedup` of B vs A from a comparison's time ratio (B time / A time, the JSON's)."""
    from pipeline.core.stats import speedup_from_time_ratio

    return speedup(*speedup_from_time_ratio(time_ratio, ci95))


def _interval(ci) -> str:
    return f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""


def shapes(feed_shapes: dict[str, list[int]]) -> str:
    """`name [dims]` per input; a run of inputs with one shape (a KV cache's 60 past tensors)
    is one entry: `60 inputs past_key_values.0.key .. past_key_values.29.value [1, 3, 128, 64]`."""
    runs: list[list] = []  # [first name, last name, count, shape]
    for name, dims in feed_shapes.items():
        if runs and runs[-1][3] == list(dims):
            runs[-1][1], runs[-1][2] = name, runs[-1][2] + 1
        else:
            runs.append([name, name, 1, list(dims)])
    def entry(first: str, last: str, count: int, dims: list[int]) -> str:
        if count == 1:
            return f"{first} {dims}"
        return f"{first}, {last} {dims}" if count == 2 else f"{count} inputs {first} .. {last} {dims}"

    return ", ".join(entry(*run) for run in runs)
