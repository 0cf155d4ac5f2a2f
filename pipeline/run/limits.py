"""Recipe limits: memory and time estimated up front, from shapes, samples and protocol.

The schema accepts any size a field can hold (a dim max of 2**28 - 1, 10**9 validation
samples, a latency protocol of 10**12 s), and such a recipe would otherwise start, then
die of an allocation failure or never end. `check_limits(recipe)` runs before any work
and refuses (RecipeError, exit 2) a recipe whose estimate is beyond a ceiling:

    memory   feeds held at once: validation and calibration samples at their split's
             largest point, inputs and as much again for outputs (the baseline keeps them)
             + one forward pass at the max point: its input bytes x ACTIVATIONS_PER_BYTE (a KV-cache
               input, past_key_values.*, counted twice: past in, present out)
             + the attention scores (QKᵀ) at the max point: batch x heads x sequence² floats,
               heads from the model's config (zoo GLM size, transformers num_attention_heads)
    time     per runner (the PyTorch baseline and each target) and timed shape: warm-up and
             timed requests, at least `min_seconds`; plus one request per sample per runner
             a request: SECONDS_PER_ELEMENT per input element, at least MIN_REQUEST_SECONDS

The figures are an order of magnitude (the model is not loaded to estimate it), meant to
catch recipes that are off by thousands, not to predict a run. The ceilings are the
environment's: PIPELINE_MAX_MEMORY_GB (default: this machine's memory) and
PIPELINE_MAX_HOURS (default 24).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.cache_io import PAST
from pipeline.core.errors import InputError, RecipeError
from pipeline.recipe.gguf_header import HfConfig

MEMORY_ENV, HOURS_ENV = "PIPELINE_MAX_MEMORY_GB", "PIPELINE_MAX_HOURS"
DEFAULT_HOURS = 24.0
ACTIVATIONS_PER_BYTE = 1024  # a forward's activations per byte of input (hidden sizes, logits)
SECONDS_PER_ELEMENT = 1e-7   # one request's time per input element (a small model on a CPU)
MIN_REQUEST_SECONDS = 1e-4   # the overhead of one request, whatever its size
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "bool": 1}
GB = 1 << 30


@dataclass(frozen=True)
class Estimate:
    memory_bytes: float
    seconds: float
    memory_parts: dict[str, float]  # what the memory is for -> bytes
    time_parts: dict[str, float]    # what the time is for -> seconds


def _elements(recipe, point: str) -> int:
    return sum(math.prod(spec.dims(point)) for spec in recipe.inputs)


def _bytes(recipe, point: str) -> int:
    return sum(math.prod(spec.dims(point)) * ITEMSIZE.get(spec.dtype, 8) for spec in recipe.inputs)


def _forward_bytes(recipe, point: str) -> float:
    """Activations scale with the token inputs; a KV-cache input (past_key_values.*) is the
    cache itself: held twice (past in, present out), not multiplied like activations."""
    cache = sum(math.prod(spec.dims(point)) * ITEMSIZE.get(spec.dtype, 8)
                for spec in recipe.inputs if spec.name.startswith(PAST))
    return float((_bytes(recipe, point) - cache) * ACTIVATIONS_PER_BYTE + 2 * cache)


def _request_seconds(elements: int) -> float:
    return max(MIN_REQUEST_SECONDS, elements * SECONDS_PER_ELEMENT)


def _samples(spec) -> int:
    """Feeds a split makes: its `samples`, else as many as its file holds (rows of a text
    file, the leading axis of arrays: an upper bound, each feed holding at least one row),
    counted without loading it; a loader's are known only once it ran (0 here)."""
    if spec.samples is not None:
        return spec.samples
    path = spec.text or spec.arrays or spec.file
    if path is None or not Path(path).is_file():
        return 0  # random feeds always have `samples`; a missing file is data's error to name
    if spec.text is not None:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b"")) + 1
    import pipeline.data.npz_files as npz_files

    try:
        if Path(path).suffix.lower() == ".npy":  # memory-mapped: the header, no data read
            shape = np.load(path, mmap_mode="r", allow_pickle=False).shape
            return shape[0] if shape else 1
        with npz_files.Npz(path) as npz:
            return max((h.shape[0] if h.shape else 1 for h in npz.headers().values()), default=0)
    except Exception:  # noqa: BLE001 - a file that cannot be read is data's to name, with its fix
        return 0


def attention_heads(recipe) -> int | None:
    """Query heads of the model, read from its config (never by building it): the zoo GLM's
    size, or a transformers config's num_attention_heads / n_head; None when not known."""
    spec = recipe.model
    if spec.zoo == "glm":
        from pipeline.zoo.glm_config import SIZES

        return SIZES[spec.kwargs.get("size", "tiny")][2]
    hf = spec.transformers
    config = hf.config if hf is not None else None
    if hf is not None and config is None and hf.pretrained and ":" not in hf.pretrained:
        config = _config_json(Path(hf.pretrained) / "config.json")
    for key in ("num_attention_heads", "n_head", "num_heads"):
        heads = (config or {}).get(key)
        if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0:
            return heads
    return None


def _config_json(path: Path) -> HfConfig | None:
    from pipeline.artifacts import json_file

    try:
        found = json_file.loads(path.read_bytes()) if path.is_file() else None
    except (OSError, json_file.Unreadable):
        return None
    return found if isinstance(found, dict) else None


def attention_bytes(recipe) -> float:
    """The attention score tensor at the max shape, float32: batch x heads x sequence^2 (QKᵀ
    and its softmax, materialized per layer by an unfused attention; layers run one after
    another, so one layer's counts). The sequence is the second dim of the token input
    ([batch, sequence], an integer tensor). 0 for a model without known heads."""
    heads = attention_heads(recipe)
    tokens = next((s for s in recipe.inputs if s.dtype in ("int64", "int32") and len(s.shape) == 2), None)
    if not heads or tokens is None:
        return 0.0
    batch, sequence = tokens.dims("max")
    return float(batch) * heads * float(sequence) ** 2 * ITEMSIZE["float32"]


def estimate(recipe) -> Estimate:
    """Memory (bytes) and time (seconds) a full run of `recipe` needs, roughly."""
    splits = [s for s in (recipe.data.validation, recipe.data.calibration) if s is not None]
    counts = [_samples(s) for s in splits]
    held = sum(n * max(_bytes(recipe, p) for p in s.shapes) for n, s in zip(counts, splits))
    memory = {"feeds and reference outputs": 2.0 * held,
              "one forward pass at the max shape": _forward_bytes(recipe, "max"),
              "attention scores (QKᵀ) at the max shape": attention_bytes(recipe)}

    latency = recipe.validate_.latency
    runners = 1 + len(recipe.targets)
    shapes = math.prod(len(sizes) for sizes in latency.sweep.values()) + 1 if latency.sweep else 1
    per_shape = max(latency.min_seconds,
                    (latency.warmup + latency.iterations) * _request_seconds(_elements(recipe, "opt")))
    samples = sum(counts)
    time = {"latency protocol": runners * shapes * per_shape,
            "accuracy and calibration samples":
                runners * samples * _request_seconds(_elements(recipe, "max"))}
    return Estimate(sum(memory.values()), sum(time.values()), memory, time)


def ceilings() -> tuple[float, float]:
    """(memory bytes, seconds) a run may need, from the environment or the defaults."""
    return (_env_number(MEMORY_ENV, _machine_memory() / GB) * GB,
            _env_number(HOURS_ENV, DEFAULT_HOURS) * 3600)


def check_limits(recipe) -> Estimate:
    """RecipeError (exit 2) naming the estimate when it is beyond a ceiling."""
    found = estimate(recipe)
    max_memory, max_seconds = ceilings()
    if found.memory_bytes > max_memory:
        raise RecipeError(
            f"{recipe.where}: needs about {_gb(found.memory_bytes)} of memory "
            f"({_largest(found.memory_parts, _gb)}), over the ceiling of {_gb(max_memory)}",
            f"lower the inputs' max dims or data.*.samples, or raise {MEMORY_ENV} on a machine that has it")
    if found.seconds > max_seconds:
        raise RecipeError(
            f"{recipe.where}: would run for about {_hours(found.seconds)} "
            f"({_largest(found.time_parts, _hours)}), over the ceiling of {_hours(max_seconds)}",
            f"lower validate.latency (min_seconds, iterations, warmup, sweep) or data.*.samples, "
            f"or raise {HOURS_ENV}")
    return found


def _largest(parts: dict[str, float], fmt) -> str:
    name, value = max(parts.items(), key=lambda kv: kv[1])
    return f"{fmt(value)} for {name}"


def _gb(n: float) -> str:
    return f"{n / GB:,.1f} GB"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h"


def _machine_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not on this system: no memory ceiling
        return math.inf


def _env_number(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0):  # also NaN; inf means no ceiling
        raise InputError(f"{name}={text!r}: not a positive number",
                         "set it to a number > 0 (inf for no ceiling), or unset it for the default")
    return value
