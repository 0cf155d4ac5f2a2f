"""One request in, one batch out, and back: checking a request against the recipe's inputs,
its length bucket, padding and stacking a batch, and splitting the outputs per request.

A request is one sample at batch size 1: each input an array of the recipe's shape with the
batch dim 1 (input_ids [1, 7], attention_mask [1, 7]); a recipe without a batch dim takes
its full shape and never batches. Requests whose variable-length dims (e.g. `sequence`)
fall into one bucket are padded up to the bucket's length with the input's pad value and
stacked: [1, 7] and [1, 12] in bucket 16 become [2, 16]. Outputs come back per request
with the padded axes cut back to the request's own length (which axes those are, the
engine's ONNX graph says by its dim names; see Signature.output_axes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.data.feeds import Feed
from pipeline.recipe.base import Dim
from pipeline.recipe.serve import ServeSpec, batch_dim, batching, buckets, variable_dims

DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32,
          "bool": np.bool_}


class BadRequest(ValueError):
    """A request that does not fit the recipe's inputs: HTTP 400 with this one line."""


@dataclass
class Signature:
    """What a request must hold, and how batches are shaped (from the recipe)."""

    inputs: list            # the recipe's InputSpecs
    outputs: list[str]
    batched: bool           # the inputs share a leading `batch` dim
    max_batch_size: int
    buckets: dict[str, list[int]]                 # variable dim symbol -> padded lengths
    pad_values: dict[str, float]
    preferred: tuple[int, ...] = ()
    # output name -> {axis: dim symbol}: axes cut back to each request's length
    output_axes: dict[str, dict[int, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, recipe, spec: ServeSpec | None = None, output_axes: dict | None = None) -> Signature:
        spec = spec or recipe.serve
        most, preferred = batching(spec, recipe.inputs)
        dims = variable_dims(recipe.inputs)
        return cls(list(recipe.inputs), list(recipe.outputs), batch_dim(recipe.inputs) is not None,
                   most, {name: buckets(spec, name, d) for name, d in dims.items()},
                   dict(spec.pad_values), preferred, output_axes or {})


def _array(name: str, value, dtype: str) -> np.ndarray:
    want = np.dtype(DTYPES.get(dtype, np.float32))
    if isinstance(value, np.ndarray):  # npz: the dtype must be the input's, exactly
        if value.dtype != want:
            raise BadRequest(f"input `{name}` has dtype {value.dtype}; the engine takes {want}")
        return value
    try:
        array = np.asarray(value)
    except ValueError as e:  # ragged nested lists
        raise BadRequest(f"input `{name}` is not a rectangular array ({e})") from None
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise BadRequest(f"input `{name}` must be a nested list of numbers")
    if want.kind in "iu" and array.size and array.dtype.kind == "f":
        raise BadRequest(f"input `{name}` holds non-integer numbers; the engine takes {want}")
    if want.kind in "iu" and array.size and not _fits(array, want):
        raise BadRequest(f"input `{name}` holds a number beyond {want}'s range")
    return array.astype(want)


def _fits(array: np.ndarray, dtype: np.dtype) -> bool:
    """Every value representable in `dtype` (a JSON 2**63 parses as uint64 and would wrap)."""
    info = np.iinfo(dtype)
    return int(array.min()) >= info.min and int(array.max()) <= info.max


def check(sig: Signature, inputs: dict) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """(the request's arrays, its length per variable dim symbol); BadRequest when it does
    not fit: unknown or missing names, dtype, rank, a fixed or ranged dim, a shared symbol."""
    if not isinstance(inputs, dict):
        raise BadRequest('the body needs {"inputs": {name: array}}')
    names = [s.name for s in sig.inputs]
    unknown, missing = sorted(set(inputs) - set(names)), [n for n in names if n not in inputs]
    if unknown or missing:
        raise BadRequest(f"inputs must be exactly {names}" + (f"; unknown: {unknown}" if unknown else "")
                         + (f"; missing: {missing}" if missing else ""))
    arrays, lengths = {}, {}
    for spec in sig.inputs:
        array = _array(spec.name, inputs[spec.name], spec.dtype)
        if array.ndim != len(spec.shape):
            raise BadRequest(f"input `{spec.name}` has shape {list(array.shape)}; it needs "
                             f"{len(spec.shape)} dims ({_describe(spec.shape, sig.batched)})")
        for axis, (size, dim) in enumerate(zip(array.shape, spec.shape)):
            if sig.batched and axis == 0:
                if size != 1:
                    raise BadRequest(f"input `{spec.name}` has batch size {size}; a request is one "
                                     "sample (batch dim 1); send one request per sample")
            elif isinstance(dim, int):
                if size != dim:
                    raise BadRequest(f"input `{spec.name}` dim {axis} is {size}; the engine takes {dim}")
            elif not dim.min <= size <= dim.max:
                raise BadRequest(f"input `{spec.name}` dim {axis} is {size}; the engine takes "
                                 f"{dim.min}..{dim.max}")
            elif dim.name and lengths.setdefault(dim.name, size) != size:
                raise BadRequest(f"input `{spec.name}` dim {axis} ({dim.name}) is {size}, another "
                                 f"input has {lengths[dim.name]}: inputs sharing `{dim.name}` must agree")
        _check_values(spec, array, sig.pad_values.get(spec.name, 0))
        arrays[spec.name] = array
    return arrays, lengths


def _check_values(spec, array: np.ndarray, pad) -> None:
    """Integer inputs (token ids, indices, masks) must lie in the recipe's `range` [low, high):
    an id past the vocabulary makes the engine's Gather fail, and with it every request
    batched with this one. The value the server pads this input with is accepted too (the
    engine is fed it anyway: a 0 attention mask on padding). Floats must be finite; a float
    input's `range` only says what random feeds are drawn from, not what the engine takes."""
    if not array.size:
        return
    if array.dtype.kind in "iub" and spec.range is not None:
        low, high = int(spec.range[0]), int(spec.range[1])
        outside = (array < low) | (array >= high)
        if pad is not None and float(pad).is_integer():
            outside &= array != int(pad)
        if outside.any():
            bad = array[outside].flat[0]
            allowed = f"{low}..{high - 1}" + (f" (or the pad value {int(pad)})"
                                              if pad is not None and not low <= pad < high else "")
            raise BadRequest(f"input `{spec.name}` holds {bad}, outside the values the engine "
                             f"takes: {allowed}")
    elif array.dtype.kind == "f" and not np.isfinite(array).all():
        raise BadRequest(f"input `{spec.name}` holds NaN or infinity; the engine takes finite numbers")


def _describe(shape: list, batched: bool) -> str:
    parts = [str(d) if isinstance(d, int) else f"{d.name or '?'} {d.min}..{d.max}" for d in shape]
    if batched:
        parts[0] = "1"
    return "[" + ", ".join(parts) + "]"


def bucket(sig: Signature, lengths: dict[str, int]) -> tuple:
    """The bucket key: each variable dim's padded length (no padding when batches are 1)."""
    if sig.max_batch_size == 1:
        return tuple(sorted(lengths.items()))
    key = []
    for name, n in sorted(lengths.items()):
        sizes = sig.buckets.get(name) or []
        key.append((name, next((b for b in sizes if b >= n), n)))
    return tuple(key)


def stack(sig: Signature, feeds: list[Feed], key: tuple) -> Feed:
    """Requests of one bucket -> one batch feed: each padded to the bucket, then concatenated
    on the batch dim ([1, n_i] x B -> [B, bucket])."""
    if not sig.batched:
        assert len(feeds) == 1, "an unbatched engine runs one request at a time"
        return feeds[0]
    target = dict(key)
    batch = {}
    for spec in sig.inputs:
        rows = []
        for feed in feeds:
            array = feed[spec.name]
            pads = [(0, 0)] * array.ndim
            for axis, dim in enumerate(spec.shape):
                if axis and isinstance(dim, Dim) and dim.name in target:
                    pads[axis] = (0, target[dim.name] - array.shape[axis])
            if any(after for _, after in pads):
                array = np.pad(array, pads, constant_values=sig.pad_values.get(spec.name, 0))
            rows.append(array)
        batch[spec.name] = np.concatenate(rows, axis=0)
    return batch


def split(sig: Signature, outputs: dict[str, np.ndarray], lengths: list[dict[str, int]]) -> list[dict]:
    """A batch's outputs -> one dict per request (row i, padded axes cut to its lengths)."""
    if not sig.batched:
        return [outputs]
    answers = []
    for i, own in enumerate(lengths):
        answer = {}
        for name, value in outputs.items():
            row = value[i:i + 1]
            for axis, symbol in sig.output_axes.get(name, {}).items():
                if symbol in own and axis < row.ndim:
                    row = np.take(row, np.arange(own[symbol]), axis=axis)
            answer[name] = row
        answers.append(answer)
    return answers
