"""What every artifact model shares: the strictness of JSON the pipeline wrote, the value
types that name files and digests, the device block, and one line for a validation error.

Artifacts (report.json, validate-<target>.json, manifest.json) are read back by other
commands and other machines; a file that does not fit its model is refused in one line
(IntegrityError, exit 5) before anything indexes into it.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from pipeline.core.paths import NAME

# `strict`: JSON the pipeline wrote has its own types; "3" is not 3, 1 is not True (an int
# is still a valid float). NaN and infinities are kept and written back as JSON's NaN /
# Infinity, the way json.dumps writes them (a cosine of a zero vector is NaN, honestly).
_CONFIG = dict(strict=True, populate_by_name=True, ser_json_inf_nan="constants",
               regex_engine="python-re")  # FileName's pattern looks ahead


class _Artifact(BaseModel):
    @model_validator(mode="after")
    def _collections_always_present(self):
        """A list or mapping field (gates, warnings, files...) is written and read back even
        when empty: readers index it without a fallback, and dumps keep only set fields."""
        for name, field in type(self).model_fields.items():
            if isinstance(field.default, (list, dict)):
                self.__pydantic_fields_set__.add(name)
        return self


class Closed(_Artifact):
    """A shape the pipeline owns end to end: an unknown key is an error (a key written by
    no code here is a file changed by hand, or a writer whose field was never declared)."""

    model_config = ConfigDict(extra="forbid", **_CONFIG)


class Open(_Artifact):
    """A shape that grows outside this module's control (the device block, measured
    resources, sections another stage is adding): declared keys are typed, others kept."""

    model_config = ConfigDict(extra="allow", **_CONFIG)


Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
# A name inside one engines/<recipe>/ folder: never a path that leaves it.
# A recorded name becomes a path in the folder: one plain component, the pattern every name
# that becomes a path is checked against (paths.NAME).
FileName = Annotated[str, StringConstraints(pattern=f"^{NAME.pattern}$")]
Count = Annotated[int, Field(ge=0)]


def _within(what: str, low: float, high: float, slack: float = 0.0) -> AfterValidator:
    """A float in [low, high] (infinities refused unless a bound is one); NaN passes (a
    cosine of a zero vector is NaN honestly, and no gate passes on it)."""

    def check(value: float) -> float:
        if not math.isnan(value) and not (low - slack <= value <= high + slack and math.isfinite(value)):
            bounds = f"[{low:g}, {high:g}]" if math.isfinite(high) else f"finite and >= {low:g}"
            raise ValueError(f"{what} {value!r} is not {bounds}")
        return value

    return AfterValidator(check)


# Figures with a range: a value outside it is a file changed by hand (a re-signed report with
# `top1_agreement: Infinity` would pass every "at least" gate). A cosine computed in float32
# may exceed 1 by rounding, hence the slack.
Cosine = Annotated[float, _within("a cosine", -1.0, 1.0, slack=1e-5)]
Share = Annotated[float, _within("a share", 0.0, 1.0)]
Ratio = Annotated[float, _within("a ratio of times", 0.0, math.inf)]  # finite, not negative


class Device(Open):
    """The machine an artifact was made on (deps.device()); other keys may be added."""

    cpu: str | None = Field(description="CPU model name.")
    gpu: str | None = Field(None, description="First NVIDIA GPU's name, or null.")
    compute_capability: str | None = Field(None, description="Its compute capability, e.g. \"9.0\".")


def describe(error: ValidationError, limit: int = 1) -> str:
    """A ValidationError in one line: the first problem's key path and message, and how
    many more there are."""
    items = error.errors()
    parts = []
    for item in items[:limit]:
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        parts.append(f"`{where}`: {item['msg']}")
    more = len(items) - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
