"""Recipes: one YAML file per model variant, validated by a pydantic schema before any work.

    base.py       the schema's building blocks (Strict, Dim, dtypes and their limits, located errors)
    targets.py    one schema per build target kind; `Target` is their union
    precision.py  the `precision:` section
    schema.py     the recipe and its other sections (Recipe)
    messages.py   the one-line messages a bad recipe gets (file or --set, key path, what is allowed)
    loader.py     YAML loading (no repeated keys), `extends:`, `--set a.b=c`, path confinement
    code_keys.py  the keys that choose code (marked CHOOSES_CODE), which no engines folder may set
    plugins.py    target schemas of third-party backends, added to the union at runtime

Imports point one way: base <- targets, precision <- schema <- messages <- loader;
schema <- plugins.
"""

from pipeline.recipe.base import Dim, DType, Strict  # noqa: F401
from pipeline.recipe.loader import list_recipes, load, recipes_dir, resolve_path  # noqa: F401
from pipeline.recipe.precision import BudgetSpec, PrecisionSpec, SensitivitySpec  # noqa: F401
from pipeline.recipe.schema import (  # noqa: F401
    CalibrationSpec,
    DataSpec,
    ExpectSpec,
    ExportSpec,
    InputSpec,
    LatencySpec,
    ModelSpec,
    OptimizeSpec,
    Recipe,
    SplitSpec,
    ToleranceSpec,
    TransformersSpec,
    ValidateSpec,
    sha256_json,
)
from pipeline.recipe.targets import (  # noqa: F401
    AOTInductorTarget,
    OnnxRuntimeTarget,
    Target,
    TargetBase,
    TensorRTTarget,
)
