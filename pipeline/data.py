"""Input feeds: seeded random values within the recipe's declared shapes and ranges.

Each split (validation, calibration, ...) draws from its own seed stream, and no
validation feed may equal a calibration feed, so accuracy is always measured on inputs
the engine was not calibrated on. Calibration feeds may instead come from a `.npz` file
or a `module:function` loader (`calibration_feeds`); those are checked against the
recipe's inputs (names, dtypes, shapes within the profile) before any stage runs.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import numpy as np

from pipeline import npz_files, safe_files
from pipeline.errors import InputError
from pipeline.recipe import Dim, InputSpec, Recipe
from pipeline.text import first_line

Feed = dict[str, np.ndarray]
Split = Literal["validation", "calibration", "export"]
Point = Literal["min", "opt", "max"]

# Stable ids for the seed streams; never reorder (it would change every cached artifact).
_STREAM = {"validation": 1, "calibration": 2, "export": 3}


def numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # shipped with onnx

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def random_feed(inputs: list[InputSpec], point: Point, rng: np.random.Generator) -> Feed:
    feed = {}
    for spec in inputs:
        shape = spec.dims(point)
        dtype = numpy_dtype(spec.dtype)
        if spec.dtype in ("int64", "int32"):
            low, high = int(spec.range[0]), int(spec.range[1])
            feed[spec.name] = rng.integers(low, high, size=shape, dtype=dtype)
        elif spec.dtype == "bool":
            feed[spec.name] = rng.random(shape) < 0.5
        elif spec.range is not None:
            feed[spec.name] = rng.uniform(*spec.range, size=shape).astype(dtype)
        else:
            feed[spec.name] = rng.standard_normal(shape).astype(dtype)
    return feed


def feeds(recipe: Recipe, split: Split, samples: int | None = None) -> list[Feed]:
    """`samples` feeds of `split`, cycling through the split's profile points."""
    if split == "calibration" and not _random_calibration(recipe):
        return calibration_feeds(recipe)[:samples]
    spec = getattr(recipe.data, split) if split != "export" else None
    points: list[Point] = spec.shapes if spec else ["opt"]
    n = samples if samples is not None else (spec.samples if spec else 1)
    rng = np.random.default_rng([recipe.data.seed, _STREAM[split]])
    out = [random_feed(recipe.inputs, points[i % len(points)], rng) for i in range(n)]
    if split == "validation":
        _drop_overlap(recipe, out, rng, points)
    return out


def _fingerprint(feed: Feed) -> str:
    h = hashlib.sha256()
    for name in sorted(feed):
        h.update(name.encode())
        h.update(str(feed[name].shape).encode())
        h.update(np.ascontiguousarray(feed[name]).tobytes())
    return h.hexdigest()


def _drop_overlap(recipe: Recipe, validation: list[Feed], rng, points) -> None:
    """Redraw any validation feed that also occurs among the calibration feeds."""
    taken = {_fingerprint(f) for f in calibration_feeds(recipe)}
    for i, feed in enumerate(validation):
        while _fingerprint(feed) in taken:
            feed = random_feed(recipe.inputs, points[i % len(points)], rng)
        validation[i] = feed


def save_feeds(path, feeds_: list[Feed], outputs: list[Feed] | None = None) -> None:
    """Feeds (and optionally reference outputs) as one .npz: `in/<i>/<name>`, `out/<i>/<name>`."""
    arrays = {f"in/{i}/{k}": v for i, f in enumerate(feeds_) for k, v in f.items()}
    for i, o in enumerate(outputs or []):
        arrays.update({f"out/{i}/{k}": v for k, v in o.items()})
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_feeds(path) -> tuple[list[Feed], list[Feed]]:
    """Inverse of save_feeds: (feeds, outputs); outputs is [] when none were saved."""
    groups: dict[str, dict[int, Feed]] = {"in": {}, "out": {}}
    with safe_files.open_regular(path) as f, np.load(f, allow_pickle=False) as z:
        for key in z.files:
            part, index, name = key.split("/", 2)
            groups[part].setdefault(int(index), {})[name] = z[key]
    return ([groups["in"][i] for i in sorted(groups["in"])],
            [groups["out"][i] for i in sorted(groups["out"])])


# ----------------------------------------------------------------------- calibration
def _random_calibration(recipe: Recipe) -> bool:
    spec = recipe.data.calibration
    return spec is not None and spec.file is None and spec.loader is None


def calibration_feeds(recipe: Recipe) -> list[Feed]:
    """The recipe's calibration feeds (at most `samples`), checked; [] when it has none."""
    spec = recipe.data.calibration
    if spec is None:
        return []
    if _random_calibration(recipe):
        return feeds(recipe, "calibration")
    if spec.file is not None:
        where = f"data.calibration.file {spec.file}"
        loaded = _load_npz(spec.file, where, recipe.inputs, spec.samples)
    else:
        where = f"data.calibration.loader {spec.loader}"
        loaded = _call_loader(spec.loader, where)
    if not loaded:
        raise InputError(f"{where}: holds no samples", "calibration needs at least one feed")
    check_feeds(recipe.inputs, loaded, where)
    return loaded[: spec.samples]


_NPZ_HINT = ("write it with numpy.savez(path, <input name>=array, ...): one array per input, "
             "samples on the first axis")


def _load_npz(path, where: str, inputs: list[InputSpec], samples: int) -> list[Feed]:
    """At most `samples` feeds from an .npz, each array's header checked against the recipe
    (names, dtypes, shapes) before its data is read (npz_files)."""
    try:
        with npz_files.Npz(path) as npz:
            headers = npz.headers()
            if headers and all(k.startswith("in/") for k in headers):
                return _saved_feeds(npz, headers, where, inputs, samples)
            return _sample_axis_feeds(npz, headers, where, inputs, samples)
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{where}: no such file") from None
    except safe_files.NotRegular as e:
        raise InputError(f"{where}: is {e.what}, not an .npz file", "point it at a regular file") from None
    except npz_files.NpzError as e:
        raise InputError(f"{where}: {e}", _NPZ_HINT) from None
    except Exception as e:  # truncated or foreign files fail inside zipfile/zlib/numpy in any way
        raise InputError(f"{where}: not a readable .npz ({first_line(e, 200, with_type=True)})",
                         _NPZ_HINT) from None


def _sample_axis_feeds(npz, headers: dict, where: str, inputs: list[InputSpec], samples: int) -> list[Feed]:
    """One array per input, samples on the first axis: the first `samples` rows of each."""
    lengths = {k: (h.shape[0] if h.shape else None) for k, h in headers.items()}
    if not headers or None in lengths.values() or len(set(lengths.values())) != 1:
        raise InputError(f"{where}: expected one array per input with the same leading sample "
                         f"axis, got {', '.join(f'{k} {h.shape}' for k, h in headers.items()) or 'nothing'}",
                         _NPZ_HINT)
    if next(iter(lengths.values())) == 0:
        return []
    # one sample's header (no data) through the feed checks: names, dtypes, shapes
    check_feeds(inputs, [{k: npz_files.Header(h.shape[1:], h.dtype, h.fortran)
                          for k, h in headers.items()}], where)
    arrays = {k: npz.read(k, samples) for k in headers}
    return [{k: a[i] for k, a in arrays.items()} for i in range(len(next(iter(arrays.values()))))]


def _saved_feeds(npz, headers: dict, where: str, inputs: list[InputSpec], samples: int) -> list[Feed]:
    """Feeds from save_feeds' layout `in/<sample index>/<input name>`, each key checked; only
    the first `samples` indices are read."""
    groups: dict[int, dict[str, str]] = {}
    for key in headers:
        _, index, name = (key.split("/", 2) + ["", ""])[:3]
        if not index.isdigit() or not name:
            raise InputError(f"{where}: array `{key}` is not named in/<sample index>/<input name> "
                             "(e.g. in/0/input_ids)", _NPZ_HINT)
        groups.setdefault(int(index), {})[name] = key
    chosen = [groups[i] for i in sorted(groups)[:samples]]
    check_feeds(inputs, [{name: headers[key] for name, key in g.items()} for g in chosen], where)
    return [{name: npz.read(key) for name, key in g.items()} for g in chosen]


def _call_loader(ref: str, where: str) -> list[Feed]:
    import importlib

    module_name, _, attr = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
        result = list(fn())
    except Exception as e:  # the user's code may fail in any way
        raise InputError(f"{where}: failed ({type(e).__name__}: {e})") from None
    if not result or not all(isinstance(f, dict) for f in result):
        raise InputError(f"{where}: must return a non-empty list of dicts input name -> array")
    return [{k: np.asarray(v) for k, v in f.items()} for f in result]


def check_feeds(inputs: list[InputSpec], feeds_: list[Feed], where: str) -> None:
    """Each feed names exactly the recipe's inputs, with their dtype and a shape in the profile."""
    expected = [i.name for i in inputs]
    for n, feed in enumerate(feeds_):
        if sorted(feed) != sorted(expected):
            raise InputError(f"{where}: feed {n} has inputs {sorted(feed)}, the recipe declares "
                             f"{expected}", "name the arrays after the recipe's inputs")
        for spec in inputs:
            array = feed[spec.name]
            if array.dtype != numpy_dtype(spec.dtype):
                raise InputError(f"{where}: feed {n} input `{spec.name}` is {array.dtype}, the "
                                 f"recipe declares {spec.dtype}")
            if not _fits(array.shape, spec.shape):
                raise InputError(f"{where}: feed {n} input `{spec.name}` has shape "
                                 f"{list(array.shape)}, outside the recipe's {_describe(spec.shape)}")
            if spec.dtype in ("int64", "int32") and spec.range is not None and array.size:
                low, high = int(spec.range[0]), int(spec.range[1])
                lo, hi = int(array.min()), int(array.max())
                if lo < low or hi >= high:
                    raise InputError(f"{where}: feed {n} input `{spec.name}` holds values {lo}..{hi}, "
                                     f"outside the recipe's range {low}..{high - 1}",
                                     f"inputs.{inputs.index(spec)}.range is [{low}, {high}): "
                                     "fix the data or the range")


def _fits(shape: tuple, dims: list) -> bool:
    if len(shape) != len(dims):
        return False
    return all(s == d if isinstance(d, int) else d.min <= s <= d.max for s, d in zip(shape, dims))


def _describe(dims: list) -> str:
    return "[" + ", ".join(str(d) if not isinstance(d, Dim) else f"{d.min}..{d.max}" for d in dims) + "]"
