"""Built-in models, by name. Each entry: a pydantic config (validated when the recipe
loads, before any work) and the dotted path of the builder (imported only when needed,
since builders import torch)."""

from __future__ import annotations

from pipeline.zoo.glm_config import GLMConfig

# name -> (config schema, "module:function" that takes the config and returns an nn.Module)
ZOO = {
    "glm": (GLMConfig, "pipeline.zoo.glm:build"),
}
