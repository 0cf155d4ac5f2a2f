"""Recipes: the pydantic schema of a recipe and its sections (loading: loader.py).

The schema is the documentation: every field has a description, and `extra="forbid"`
everywhere so a misspelt key is an error instead of a silently ignored setting. A recipe
is fully validated (including the zoo model's own config) before any stage runs.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pipeline.core.text import display_path
from pipeline.passes import names as _pass_names
from pipeline.recipe.base import (  # noqa: F401
    _FLOAT_LIMITS,
    _INT_LIMITS,
    CODE,
    INTEGER_DTYPES,
    MAX_ELEMENTS,
    SEED_MAX,
    Dim,
    DType,
    LocatedError,
    NestedError,
    Strict,
)
from pipeline.recipe.data import CalibrationSpec, DataSpec, SplitSpec, parse_task_loss  # noqa: F401
from pipeline.recipe.model import ModelSpec, TransformersSpec  # noqa: F401
from pipeline.recipe.precision import FP32_BLOCK_LIST, BudgetSpec, PrecisionSpec, SensitivitySpec  # noqa: F401
from pipeline.recipe.serve import ServeSpec
from pipeline.recipe.serve import check as check_serve
from pipeline.recipe.targets import (  # noqa: F401
    AOTInductorTarget,
    OnnxRuntimeTarget,
    Target,
    TargetBase,
    TensorRTTarget,
)
from pipeline.recipe.validate import ExpectSpec, LatencySpec, ToleranceSpec, ValidateSpec  # noqa: F401
from pipeline.recipe.workload import WorkloadSpec, kv_signature

PASS_NAMES = _pass_names()


# ----------------------------------------------------------------------------- inputs
class InputSpec(Strict):
    name: str = Field(min_length=1, description="Input name, as in forward() and the ONNX graph.")
    dtype: DType = Field(description="Element type.")
    shape: list[Annotated[int, Field(ge=1)] | Dim] = Field(
        min_length=0, description="Each dim a fixed int or a {min, opt, max} range."
    )
    range: tuple[Annotated[float, Field(strict=True)], Annotated[float, Field(strict=True)]] | None = Field(
        None, strict=False,  # a YAML list is a fine tuple; its items stay strict floats
        description="Values are drawn from [low, high) (integers: low..high-1). Required for "
        "integer inputs such as token ids; floats default to a standard normal.",
    )

    @model_validator(mode="after")
    def _range(self) -> InputSpec:
        if self.range is not None:
            low, high = self.range
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                raise ValueError(f"range needs finite low < high (got {list(self.range)})")
            if self.dtype in _INT_LIMITS:
                lo, hi = _INT_LIMITS[self.dtype]
                if low != int(low) or high != int(high) or not lo <= low < high <= hi:
                    bits = 63 if self.dtype == "int64" else 31
                    raise ValueError(f"range of {self.dtype} input `{self.name}` needs whole numbers "
                                     f"within [-2**{bits}, 2**{bits}] (got {list(self.range)})")
            elif self.dtype in _FLOAT_LIMITS and max(-low, high) > _FLOAT_LIMITS[self.dtype]:
                raise ValueError(f"range {list(self.range)} overflows {self.dtype} "
                                 f"(largest value {_FLOAT_LIMITS[self.dtype]:g})")
        if self.dtype in INTEGER_DTYPES and self.range is None:
            raise ValueError(f"integer input `{self.name}` needs `range: [low, high]`")
        elements = math.prod(self.dims("max"))
        if elements > MAX_ELEMENTS:
            raise ValueError(f"input `{self.name}` has {elements:,} elements at the max point; "
                             f"an engine tensor holds at most {MAX_ELEMENTS:,} (2**31-1)")
        return self

    def dims(self, which: Literal["min", "opt", "max"]) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else getattr(d, which) for d in self.shape)


# ----------------------------------------------------------------------------- export
class ParitySpec(Strict):
    max_abs: float = Field(1e-3, gt=0, description="Largest allowed |onnx - torch| element.")
    cosine_min: float = Field(0.9999, ge=-1, le=1, description="Smallest allowed cosine.")


class ExportSpec(Strict):
    exporter: Literal["dynamo", "torchscript"] = Field(
        "dynamo", description="torch.onnx.export path: `dynamo` (torch.export) or `torchscript`."
    )
    opset: int | None = Field(None, ge=13, le=23, description="ONNX opset; exporter default if unset.")
    parity: ParitySpec = Field(
        ParitySpec(), description="Check of the exported graph against PyTorch on one feed."
    )


# ----------------------------------------------------------------------------- optimize
PassName = Literal[PASS_NAMES]  # type: ignore[valid-type]


class PassToleranceSpec(Strict):
    max_abs: float = Field(
        1e-4, gt=0, description="Largest allowed |pass output - pass input| element, per output "
        "(the tanh -> exact GELU trap moves outputs by ~1e-4 to 1e-3).")
    cosine_min: float = Field(0.99999, ge=-1, le=1, description="Smallest allowed cosine, per output.")


class OptimizeSpec(Strict):
    passes: list[PassName] = Field(
        ["fold_constants", "ort_fusions", "pack_matmuls"],
        description="Graph passes in order (pipeline/passes): " + ", ".join(PASS_NAMES)
        + ". An empty list skips the stage (engines build from the exported graph).")
    options: dict[PassName, dict[str, Any]] = Field(
        default_factory=dict, description="Per-pass keyword options, e.g. "
        "{ort_transformers: {model_type: bert, num_heads: 12}}.")
    tolerance: PassToleranceSpec = Field(
        PassToleranceSpec(), description="How far a pass may move any output on the check feeds "
        "(min, opt and max shapes) before it is rejected.")
    strict: bool = Field(
        False, description="Stop the run (exit 4) at the first rejected pass, instead of going "
        "on from the last good graph.")
    latency: LatencySpec | None = Field(
        None, description="Time the final graph against the exported one in one process (ORT, "
        "CPU). Default: a short protocol; null in YAML is the default too.")

    @model_validator(mode="after")
    def _options_fit(self) -> OptimizeSpec:
        from pipeline.passes import PASSES

        for name, opts in self.options.items():
            if name not in self.passes:
                raise LocatedError(("options", name),
                                    f"options given for pass `{name}`, which is not in `passes`")
            unknown = sorted(set(opts) - set(PASSES[name].options))
            if unknown:
                allowed = ", ".join(PASSES[name].options) or "none"
                raise LocatedError(("options", name),
                                    f"pass `{name}` has no option {', '.join(unknown)}; allowed: {allowed}")
        return self


# ----------------------------------------------------------------------------- recipe
class Recipe(Strict):
    description: str = Field("", description="One line on what this variant is.")
    model: ModelSpec = Field(description="The PyTorch model.")
    inputs: list[InputSpec] = Field(min_length=1, description="Model inputs, in forward() order.")
    outputs: list[Annotated[str, Field(min_length=1)]] = Field(
        ["output"], min_length=1, description="Names given to the model's outputs, in order."
    )
    data: DataSpec = Field(DataSpec(), description="Input feeds for calibration and validation.")
    export: ExportSpec = Field(ExportSpec(), description="PyTorch -> ONNX.")
    optimize: OptimizeSpec = Field(
        OptimizeSpec(), description="Graph passes after export, each checked against its input.")
    targets: list[Target] = Field(min_length=1, description="Engines to build.")
    precision: PrecisionSpec = Field(PrecisionSpec(), description="Precision in the graph.")
    # the `validate:` section; `validate_` since pydantic's BaseModel has a `validate` (one
    # name in code: never `validation`, which is the data split `data.validation`)
    validate_: ValidateSpec = Field(
        ValidateSpec(), alias="validate", description="Accuracy and latency vs PyTorch."
    )
    expect: ExpectSpec = Field(ExpectSpec(), description="Gates: speed and accuracy promises.")
    workload: WorkloadSpec = Field(
        WorkloadSpec(), description="What one request is: a forward pass, or generation "
        "(prefill + decode with a KV cache; the inputs then derive from `input_ids`).")
    serve: ServeSpec = Field(
        ServeSpec(), description="`pipeline serve`: dynamic batching (Triton's semantics), length "
        "buckets, replicas; `pipeline deploy --triton` writes the same batching into config.pbtxt. "
        "Not part of the recipe's digest: serving settings never rebuild an engine.")

    # Set by the loader, not by YAML.
    name: str = Field("recipe", exclude=True)
    source: Path | None = Field(None, exclude=True)
    overrides: tuple[str, ...] = Field((), exclude=True)  # the --set values, as given

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("inputs")
    @classmethod
    def _unique_inputs(cls, inputs: list[InputSpec]) -> list[InputSpec]:
        names = [i.name for i in inputs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"input names must be unique (repeated: {', '.join(dupes)})")
        return inputs

    @field_validator("outputs")
    @classmethod
    def _unique_outputs(cls, outputs: list[str]) -> list[str]:
        repeated = sorted({o for o in outputs if outputs.count(o) > 1})
        if repeated:
            raise ValueError(f"output names must be unique (repeated: {', '.join(repeated)})")
        return outputs

    @model_validator(mode="after")
    def _generation_signature(self) -> Recipe:
        """workload generation: the KV-cache graph's inputs and outputs (pipeline/recipe/workload.py)."""
        if self.workload.kv_cache:
            try:
                self.inputs, self.outputs = kv_signature(self.inputs, self.model, self.workload, InputSpec)
            except ValueError as e:
                raise LocatedError(("workload", "kind"), str(e)) from None
        return self

    @model_validator(mode="after")
    def _cross_checks(self) -> Recipe:
        ids = [t.id for t in self.targets]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise LocatedError(("targets",), f"target names must be unique (repeated: "
                                f"{', '.join(dupes)}); set `name:`")
        # Dims sharing a symbol must agree, or the engine's profile is contradictory.
        seen: dict[str, Dim] = {}
        for n, spec in enumerate(self.inputs):
            for d, dim in enumerate(spec.shape):
                if isinstance(dim, Dim) and dim.name:
                    other = seen.setdefault(dim.name, dim)
                    if (other.min, other.opt, other.max) != (dim.min, dim.opt, dim.max):
                        raise LocatedError(("inputs", n, "shape", d),
                                            f"dim `{dim.name}` is declared with different ranges")
        for n, target in enumerate(self.targets):
            try:
                target.check(self)
            except ValueError as e:
                raise LocatedError(("targets", n), str(e)) from None
        if self.precision.needs_calibration and self.data.calibration is None:
            raise LocatedError(("data", "calibration"), f"precision.mode {self.precision.mode}"
                                + (f" int4_method {self.precision.int4_method}" if self.precision.mode == "int4" else "")
                                + " needs calibration data: set data.calibration (random samples, `text`, "
                                "a .npz `file` or a `loader`)")
        clash = sorted(set(self.outputs) & {i.name for i in self.inputs})
        if clash:
            raise LocatedError(("outputs",), f"outputs and inputs share names ({', '.join(clash)}); "
                                "an ONNX graph names each value once")
        for n, name in enumerate(self.validate_.top1_outputs or []):
            if name not in self.outputs:
                raise LocatedError(("validate", "top1_outputs", n),
                                    f"`{name}` is not one of outputs {self.outputs}")
        if self.validate_.tolerance.top1_min is not None and not self.top1_outputs():
            raise LocatedError(("validate", "tolerance", "top1_min"),
                                f"no output is a logits output, so top-1 cannot be measured: "
                                f"name the logits in validate.top1_outputs (outputs: {self.outputs})")
        self._check_task()
        for name in ("max_answer_accuracy_loss", "max_perplexity_ratio"):
            if getattr(self.expect, name) is not None and self.workload.chat is None:
                raise LocatedError(("expect", name), "needs workload.chat (the question set and "
                                   "held-out text the score is measured on)")
        hf, p = self.model.transformers, self.precision
        if hf is not None and hf.awq and (p.mode, p.int4_source, p.int4_method, p.block_size) != (
                "int4", "requantize", "rtn", 32):
            raise LocatedError(("model", "transformers", "awq"), "the scales are searched for precision "
                               "{mode: int4, int4_source: requantize, int4_method: rtn, block_size: 32}; "
                               "another rounding needs other scales (with hqq they cost 21 more points "
                               "of answers, benchmarks/results/float-int4-2026-12-07.md): set that "
                               "precision or drop awq")
        if p.mode == "int4" and p.int4_method == "autoround" and (hf is None or hf.task != "logits"):
            raise LocatedError(("precision", "int4_method"), "autoround fits the decoder layers of a "
                               "transformers causal LM in PyTorch: set model.transformers (task logits), "
                               "or use int4_method gptq, which needs only the ONNX graph")
        try:
            check_serve(self.serve, self.inputs)
        except ValueError as e:
            raise LocatedError(("serve",), str(e)) from None
        if self.expect.max_accuracy_loss is not None and not self.top1_outputs():
            raise LocatedError(("expect", "max_accuracy_loss"),
                                "needs a logits output (see validate.top1_outputs)")
        for symbol, sizes in self.validate_.latency.sweep.items():
            if symbol not in seen:
                raise LocatedError(("validate", "latency", "sweep"),
                                    f"`{symbol}` is not a dim symbol of the inputs "
                                    f"(declared: {', '.join(sorted(seen)) or 'none'})")
            dim = seen[symbol]
            bad = [n for n in sizes if not dim.min <= n <= dim.max]
            if bad or not sizes:
                raise LocatedError(("validate", "latency", "sweep", symbol),
                                    f"sizes must be within [{dim.min}, {dim.max}] (got {sizes})")
        return self

    def _check_task(self) -> None:
        task, split = self.validate_.task, self.data.validation
        if self.expect.max_task_loss is not None:
            if task is None:
                raise LocatedError(("expect", "max_task_loss"), "needs validate.task (the metric)")
            parse_task_loss(self.expect.max_task_loss)  # raises ValueError on a bad form
        if task is None:
            return
        if not split.real:
            raise LocatedError(("validate", "task"), f"`{task}` needs real validation data: set "
                                "data.validation.text (or arrays, file, loader)")
        wants = {"perplexity": "text", "embedding_similarity": "text", "accuracy": None}[task]
        if wants and split.text is None:
            raise LocatedError(("validate", "task"), f"`{task}` is scored on text: set "
                                "data.validation.text")
        if task == "accuracy" and split.text is None and split.arrays is None:
            raise LocatedError(("validate", "task"), "`accuracy` needs labels: set "
                                "data.validation.arrays (.npz with `labels`) or text (.jsonl with `label`)")

    def section(self, *keys: str) -> Any:
        """JSON-able dump of the named top-level sections (the input of a cache key)."""
        dump = self.model_dump(mode="json", by_alias=True)
        return {k: dump[k] for k in keys}

    @property
    def where(self) -> str:
        """The recipe file as messages show it (relative to the project when inside it)."""
        return display_path(self.source) if self.source else self.name

    @property
    def digest(self) -> str:
        # `serve:` only says how built engines are served: changing it rebuilds nothing
        return sha256_json(self.model_dump(mode="json", by_alias=True, exclude={"serve"}))

    def top1_outputs(self) -> list[str]:
        if self.validate_.top1_outputs is not None:
            return self.validate_.top1_outputs
        return [o for o in self.outputs if "logit" in o.lower()]


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


