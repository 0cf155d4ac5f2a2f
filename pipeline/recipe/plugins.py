"""Target kinds brought at runtime by third-party backends (pipeline.backends.register).

The built-in schemas are listed in targets.SCHEMAS; a plugin's schema joins that dict (so
TARGET_KINDS and the recipe messages know the kind), and Recipe validates `targets:` against
the union of what the dict holds then (targets.Target): no class is rebuilt.
"""

from __future__ import annotations

from pipeline.recipe.targets import SCHEMAS, TargetBase


def add_target_schema(schema: type[TargetBase]) -> None:
    field = schema.model_fields.get("kind") if isinstance(schema, type) else None
    kind = field.default if field is not None else None
    if not isinstance(kind, str) or not issubclass(schema, TargetBase):
        raise TypeError(f"{schema!r}: a target schema subclasses pipeline.recipe.TargetBase and "
                        'declares `kind: Literal["<kind>"] = "<kind>"`')
    if SCHEMAS.get(kind) is schema:
        return
    if kind in SCHEMAS:
        raise ValueError(f"target kind `{kind}` already has a schema ({SCHEMAS[kind].__name__})")
    SCHEMAS[kind] = schema
