"""The one reader of JSON files that may have been planted: bounded size, depth and numbers.

Every JSON artifact (manifest.json, report.json, validate-/versus-*.json, compare.json, a
tune candidate's result.json, a build's info file) can come from a downloaded folder, and
Python's json module trusts its input in three ways a planted file can turn into a crash
rather than a refusal:

    size      json.loads holds the whole text and its objects: a 10 GB file is read whole
    depth     100,000 nested `[` exhaust the C recursion limit (RecursionError), and a few
              hundred that json.loads accepts still crash the readers that recurse over them
              (pydantic, json.dumps, the report table)
    integers  int() of more than 4,300 digits raises ValueError (CVE-2020-10735's limit); a
              number of that size is never a count, a size or a version anyway

`read(path)` and `loads(text)` bound all three and raise Unreadable (one line, what is
wrong) for anything that is not small, shallow JSON; callers name the file and map it to
their error (the store: IntegrityError, exit 5). NaN and Infinity are kept: the pipeline
writes them (a zero vector's cosine), and the artifact models decide where they may stand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.core import safe_files

MAX_BYTES = 64 << 20     # the largest artifact written here is a report of a few hundred KB
MAX_DEPTH = 64           # the deepest the pipeline writes is ~8 (report > engine > sweep > ...)
MAX_INT_DIGITS = 32      # a count, a size in bytes, a timestamp: 20 digits hold any int64


class Unreadable(ValueError):
    """A JSON file that cannot be read safely or is not JSON; `problem` is one line."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise Unreadable(f"an integer of {digits} digits (at most {MAX_INT_DIGITS} are read)")
    return int(text)


def _check_depth(data: Any) -> None:
    """Iteratively (no recursion of its own): every container at most MAX_DEPTH deep."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise Unreadable(f"nested deeper than {MAX_DEPTH} levels")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def loads(text: str | bytes) -> Any:
    """Parsed JSON within the bounds, or Unreadable."""
    if len(text) > MAX_BYTES:
        raise Unreadable(f"{len(text):,} bytes, over the {MAX_BYTES >> 20} MiB a JSON artifact may hold")
    try:
        data = json.loads(text, parse_int=_bounded_int)
    except RecursionError:
        raise Unreadable(f"nested deeper than {MAX_DEPTH} levels") from None
    except Unreadable:
        raise
    except UnicodeDecodeError as e:
        raise Unreadable(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except ValueError as e:  # JSONDecodeError and int()'s own limits
        raise Unreadable(f"not valid JSON ({str(e).splitlines()[0][:120]})") from None
    if isinstance(data, (dict, list)):
        _check_depth(data)
    return data


def read(path: Path) -> Any:
    """The JSON content of a regular file (never through a symlink, never a FIFO), bounded."""
    try:
        with safe_files.open_regular(path) as f:
            raw = f.read(MAX_BYTES + 1)
    except safe_files.NotRegular as e:
        raise Unreadable(f"{e.what}, not a regular file") from None
    except OSError as e:
        raise Unreadable(f"cannot be read ({e.strerror or e})") from None
    if len(raw) > MAX_BYTES:
        raise Unreadable(f"over the {MAX_BYTES >> 20} MiB a JSON artifact may hold")
    return loads(raw)
