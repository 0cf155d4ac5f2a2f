"""Building blocks of the recipe schema: strict models, element types and their limits, and
the dynamic dimension every input shape and engine profile is made of."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DType = Literal["float32", "float16", "bfloat16", "int64", "int32", "bool"]
INTEGER_DTYPES = ("int64", "int32")
# Values an input of each dtype can hold: integer ranges are [low, high), floats |x| <= limit.
_INT_LIMITS = {"int64": (-(2**63), 2**63), "int32": (-(2**31), 2**31)}
_FLOAT_LIMITS = {"float16": 65504.0, "bfloat16": 3.38e38, "float32": 3.4028234e38}
MAX_ELEMENTS = 2**31 - 1  # per tensor: engines (TensorRT, ORT kernels) index with int32
SEED_MAX = 2**63 - 1


# In a field's json_schema_extra: the field names code the pipeline imports and calls
# (`module:function`); recipe/code_keys.py finds them, and no engines folder may set one.
CHOOSES_CODE = "chooses_code"
CODE = {CHOOSES_CODE: True}


class Strict(BaseModel):
    """Base of every recipe section. `extra="forbid"`: a misspelt key is an error.
    `strict=True`: no silent coercion (`seed: true` is not 1, `samples: "8"` is not 8; an
    int is still a valid float). `allow_inf_nan=False`: `.inf` and `.nan` are refused in every
    float field (an infinite `min_seconds` would time forever). Fields that must take YAML's
    plain forms (a path string, a `[low, high]` list) opt out with `Field(strict=False)`."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Dim(Strict):
    """A dynamic dimension: engines accept [min, max] and are tuned for `opt`."""

    min: int = Field(ge=1, description="Smallest size the engine must accept.")
    opt: int = Field(ge=1, description="Size the engine is tuned and timed for.")
    max: int = Field(ge=1, description="Largest size the engine must accept.")
    name: str | None = Field(
        None,
        pattern=r"^[A-Za-z_]\w*$",
        description="Symbol shared by dims that must be equal (e.g. `batch` across inputs).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Dim:
        if not self.min <= self.opt <= self.max:
            raise ValueError(f"needs min <= opt <= max (got {self.min}, {self.opt}, {self.max})")
        return self

class NestedError(ValueError):
    """Carries a ValidationError of a nested schema validated by hand (zoo kwargs)."""

    def __init__(self, prefix: str, error: ValidationError):
        super().__init__(str(error))
        self.prefix = prefix
        self.error = error


class LocatedError(ValueError):
    """A cross-check's problem at a key path below the model that raised it (e.g.
    `validate.latency.sweep.batch` from the Recipe), so the message names that key once and
    the loader blames the file or --set that set it."""

    def __init__(self, loc: tuple, message: str):
        super().__init__(message)
        self.loc = loc
        self.message = message
