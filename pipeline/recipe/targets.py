"""Recipe schemas of the build targets, one class per kind; `Target` is their union.

SCHEMAS (kind -> class) is the one list of target kinds: the union and TARGET_KINDS are
derived from it, when a recipe is validated (`Target`), so the Recipe class never changes. Adding a built-in kind: a class here (with `kind: Literal[...]`), its line in
SCHEMAS, and a backend module registered in pipeline/backends. A third-party backend brings
its own schema class, added at runtime by `pipeline.backends.register`
(pipeline.recipe.plugins.add_target_schema); this module imports no backend.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, Union

from pydantic import Field, PlainValidator, SerializeAsAny, TypeAdapter, model_validator

from pipeline.recipe.base import Dim, LocatedError, Strict


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

    def check(self, recipe) -> None:  # recipe: a pipeline.recipe.Recipe
        """Cross-checks against the whole recipe (raise ValueError); none by default."""

    def may_use_gpu(self) -> bool:
        """Whether the build may run on (and so depend on) the GPU: a `cuda` or `auto`
        provider or device. Read from the target alone, so the stage cache's keys need no
        backend (whose module imports its runtime)."""
        where = getattr(self, "provider", None) or getattr(self, "device", None)
        return where in ("cuda", "auto")


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

    def may_use_gpu(self) -> bool:
        return True  # a TensorRT plan is built for, and tied to, one GPU
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
    require_layer_precision: Literal["int8", "fp8", "fp16", "bf16"] | None = Field(
        None, description="Fail the engine unless at least `layer_precision_min_share` of its "
        "layer time (layer count when untimed) runs at this precision or narrower."
    )
    layer_precision_min_share: float = Field(
        0.5, gt=0, le=1, description="Share required by `require_layer_precision`."
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data):
        """The keys were renamed (pre-1.0, no alias): `precision.require_effective_precision`
        is a share of FLOPs, this one a precision name, and one name meant both."""
        for old, new in RENAMED.items():
            if isinstance(data, dict) and old in data:
                raise LocatedError((old,), f"renamed to `{new}`: write `{new}: {data[old]}` "
                                   "(`precision.require_effective_precision` is another key, a share)")
        return data

    def check(self, recipe) -> None:  # recipe: a pipeline.recipe.Recipe
        if recipe.precision.mode == "int8" and recipe.precision.scheme == "dynamic":
            raise ValueError(f"target `{self.id}`: TensorRT builds static Q/DQ INT8 only; "
                             "precision.scheme dynamic writes ONNX Runtime ops (use scheme: static, "
                             "or a recipe without this target)")
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


RENAMED = {"require_effective_precision": "require_layer_precision",
           "effective_precision_min_share": "layer_precision_min_share"}

SCHEMAS: dict[str, type[TargetBase]] = {
    "onnxruntime": OnnxRuntimeTarget,
    "tensorrt": TensorRTTarget,
    "aotinductor": AOTInductorTarget,
}
TARGET_KINDS = SCHEMAS.keys()  # a live view: kinds registered at runtime show up in messages


def union(schemas) -> object:
    """The tagged union of target schemas pydantic validates a `targets:` item against."""
    return Annotated[Union[tuple(schemas)], Field(discriminator="kind")]  # noqa: UP007


@functools.lru_cache(maxsize=8)
def _adapter(schemas: tuple[type[TargetBase], ...]) -> TypeAdapter:
    """The union's validator, built once per registry state (the schemas, in order)."""
    return TypeAdapter(union(schemas))


def _validate_target(value: Any) -> TargetBase:
    # A ValidationError raised here joins the recipe's with its loc under `targets.<i>`:
    # the same errors (union_tag_invalid, targets.0.<kind>.x, ...) as a union field gives.
    return _adapter(tuple(SCHEMAS.values())).validate_python(value)


class _RegisteredKinds:
    """Annotation metadata of `Target`: its JSON schema is the registered kinds' union, and
    it tells the recipe messages (messages.allowed_keys) which schemas a target can be."""

    @staticmethod
    def schemas() -> list[type[TargetBase]]:
        return list(SCHEMAS.values())

    @classmethod
    def __get_pydantic_json_schema__(cls, _core_schema, handler):
        return handler(_adapter(tuple(SCHEMAS.values())).core_schema)


# One `targets:` item: the schema of its `kind` in SCHEMAS as it is when a recipe is validated,
# so a plugin registering a kind (recipe/plugins.py) changes a dict, never the Recipe class.
# Dumped as its own schema (SerializeAsAny), not as TargetBase.
Target = Annotated[SerializeAsAny[TargetBase], PlainValidator(_validate_target), _RegisteredKinds]
