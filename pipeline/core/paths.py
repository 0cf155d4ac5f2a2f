"""Where the files a recipe names may live: inside the project, or in a declared data folder.

A recipe is shared text (a pull request, a CI config), so a path in it must not reach
/etc, ~/.ssh or another project through `..`, an absolute path or a symlink. Relative paths
resolve against the project root (the current directory, which holds recipes/ and
engines/); symlinks are followed before the check. Data kept elsewhere is declared, outside
any recipe, in the environment: PIPELINE_DATA_DIRS, folders separated by `:` (os.pathsep).

Names that become one path component (a recipe name, a target, a file recorded in a
manifest, a Triton model folder) come from files that may have been edited: each is matched
against NAME before use, and `child()` proves the path it makes stays in its folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

DATA_DIRS_ENV = "PIPELINE_DATA_DIRS"

# One path component: no separator, no leading dot (not `.`, `..` or a hidden file), no
# NUL, no space; what recipe names, target ids and the files the stages write look like.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,199}")


def name_problem(name: object) -> str | None:
    """Why `name` cannot be one path component, or None when it matches NAME."""
    if isinstance(name, str) and NAME.fullmatch(name):
        return None
    return f"{name!r} is not a plain file name (letters, digits, `_.+-`, not starting with a dot)"


def child(root: Path, name: str) -> Path:
    """root/name, after proving that it is a direct child of root (ValueError otherwise)."""
    problem = name_problem(name)
    if problem:
        raise ValueError(problem)
    path = Path(root) / name
    if path.parent != Path(root) or path.name != name:
        raise ValueError(f"{name!r} leaves {root}")
    return path


def project_root() -> Path:
    return Path.cwd().resolve()


def data_dirs() -> list[Path]:
    """The declared data folders (resolved); empty entries are ignored."""
    raw = os.environ.get(DATA_DIRS_ENV, "")
    return [Path(p).expanduser().resolve() for p in raw.split(os.pathsep) if p.strip()]


def allowed_roots(*extra: Path) -> list[Path]:
    return [project_root(), *data_dirs(), *(Path(p).resolve() for p in extra)]


def escape(path: Path | str, roots: list[Path]) -> str | None:
    """Why `path` is not allowed (it leaves every root), or None when it is inside one."""
    text = str(path)
    if "\0" in text:
        return "the path contains a NUL byte"
    try:
        resolved = Path(text).expanduser().resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
        return f"cannot resolve the path ({e})"
    if any(resolved == root or root in resolved.parents for root in roots):
        return None
    shown = ", ".join(str(r) for r in roots)
    return (f"{text} resolves to {resolved}, outside the project and the data folders ({shown}); "
            f"move the file into the project or add its folder to {DATA_DIRS_ENV}")
