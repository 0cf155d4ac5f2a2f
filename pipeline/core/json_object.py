"""The one name for a JSON object held as a dict: what a file format or a dump holds, key ->
JSON value, as opposed to a record of this pipeline's, which is a dataclass or a model."""

from __future__ import annotations

from typing import Any

# A JSON (or YAML) object as parsed or about to be written, whose shape is a file format's
# own or a typed record's dump: a recipe file, a JSON Schema, transformers' config.json,
# genai_config.json, an in-toto statement, a cache key's part, a model's `dump()`.
JsonObject = dict[str, Any]
