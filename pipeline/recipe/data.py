"""The recipe's `data:` section: where each split's feeds come from (random, or one real
source), and the form of expect.max_task_loss. Loading the data: pipeline/data/."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from pipeline.core.user_code import FUNCTION_REF
from pipeline.recipe.base import CODE, SEED_MAX, LocatedError, Strict


class SplitSpec(Strict):
    """One split's data: seeded random feeds (the default), or one real source."""

    samples: int | None = Field(
        None, ge=1, description="Feeds in this split: how many are drawn (random; default 8 "
        "for validation, 16 for calibration), or the most taken from a file, loader or text "
        "(default: all of it).")
    shapes: list[Literal["min", "opt", "max"]] = Field(
        ["opt"], min_length=1, description="Profile points random samples cycle through."
    )
    file: Path | None = Field(
        None, strict=False, description="A .npz of feeds: one array per input name with a "
        "leading sample axis, or `in/<i>/<name>` keys (as baseline.npz). Relative to the "
        "working directory.",
    )
    loader: str | None = Field(
        None, pattern=FUNCTION_REF, json_schema_extra=CODE,
        description="`package.module:function` returning a list of feeds (dicts name -> array); "
        "searched beside the recipe, in the working directory, then the environment.",
    )
    text: Path | None = Field(
        None, strict=False, description="Text, tokenized for `input_ids` (+ `attention_mask`): "
        "a .txt (one sentence a line) or a .jsonl of {text}, {text, label} or {sentence1, "
        "sentence2, score} rows. Padded per batch and truncated within the profile.",
    )
    tokenizer: str | None = Field(
        None, json_schema_extra=CODE, description="For `text`: `bytes` (UTF-8 bytes as ids), a tokenizer folder, or "
        "`module:function` returning one. Default: the transformers model's own.")
    arrays: Path | None = Field(
        None, strict=False, description="Samples on the leading axis (e.g. images): an .npy for "
        "the one input, or an .npz with one array per input and optional `labels` [samples].",
    )
    batch: int | None = Field(
        None, ge=1, description="Rows (sentences, images) per feed for `text` and `arrays`; "
        "default: the profile's opt batch.")

    @model_validator(mode="after")
    def _one_source(self) -> SplitSpec:
        given = [k for k in ("file", "loader", "text", "arrays") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of file, loader, text and arrays (got "
                             f"{', '.join(given)}; none: seeded random feeds)")
        if self.tokenizer is not None and self.text is None:
            raise ValueError("`tokenizer` goes with `text`")
        if self.batch is not None and given[:1] not in (["text"], ["arrays"]):
            raise ValueError("`batch` goes with `text` or `arrays`")
        return self

    @property
    def real(self) -> bool:
        """Does the split come from real data (not the random generator)?"""
        return any(getattr(self, k) is not None for k in ("file", "loader", "text", "arrays"))


CalibrationSpec = SplitSpec  # the name older code imports


class DataSpec(Strict):
    seed: int = Field(0, ge=0, le=SEED_MAX,
                      description="Seed of the random feeds; splits use disjoint streams.")
    validation: SplitSpec = Field(
        SplitSpec(samples=8), description="Held-out feeds for accuracy (never used to calibrate)."
    )
    calibration: SplitSpec | None = Field(
        SplitSpec(samples=16),
        description="Feeds for calibration (quantized precisions); null: none (fp32/fp16 only).",
    )



def parse_task_loss(value: float | str) -> tuple[float, bool]:
    """expect.max_task_loss -> (bound, relative): 0.01 -> (0.01, False), '2%' -> (0.02, True)."""
    if isinstance(value, str):
        text = value.strip()
        try:
            share = float(text[:-1]) / 100 if text.endswith("%") else None
        except ValueError:
            share = None
        if share is None or not math.isfinite(share) or share < 0:
            raise LocatedError(("expect", "max_task_loss"),
                               f"`{value}` is neither a number nor a percentage like '2%'")
        return share, True
    if not math.isfinite(value) or value < 0:
        raise LocatedError(("expect", "max_task_loss"), f"needs a finite number >= 0 (got {value})")
    return float(value), False
