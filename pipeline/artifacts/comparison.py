"""compare.json and compare-generation.json as pydantic models: what `pipeline compare` wrote.

    CompareBase     schema, created, recipes, reference (A), shared_targets, method
      ForwardCompare      the forward workload (compare/tensor.py): models and whether they
                          differ, side-by-side rows, the interleaved timing, where the time
                          went (profiles, deltas, cause tags), where the error came from
      GenerationCompare   generation (compare/generation.py): time per task and per phase,
                          per engine and B against A, op-category profiles per phase,
                          task scores (workload.chat)

The sections measured by bench/ and explain/ are objects here (their writers own them);
the envelope is Closed: a key no writer declared is refused.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.artifacts.base import Closed


class CompareMethod(Closed):
    """How the comparison was measured, in words."""

    timing: str
    profiles: str | None = Field(description="How the profiles were taken; None: none were.")


class CompareBase(Closed):
    schema_: int = Field(alias="schema")
    workload: str = Field(description="The recipes' workload kind.")
    created: str
    recipes: list[str]
    reference: str = Field(description="Recipe A: every other one is compared with it.")
    shared_targets: list[str] = Field(description="Target ids built by every recipe.")
    method: CompareMethod


class ModelInfo(Closed):
    """A recipe's exported model: its size and the shape it is tuned for."""

    parameters: int | None = Field(description="Initializer elements of the exported ONNX.")
    opt_dims: dict[str, int] = Field(description="Each named dynamic dim's opt value.")
    description: str | None


class ForwardCompare(CompareBase):
    schema_: Literal[2] = Field(alias="schema")
    workload: Literal["forward"] = "forward"
    models: dict[str, ModelInfo]
    models_differ: dict[str, str]
    engines: list[dict[str, Any]]
    timing: dict[str, Any]
    time_explained: dict[str, Any]
    error_explained: dict[str, Any]


class GenerationCompare(CompareBase):
    schema_: Literal[1] = Field(alias="schema")
    workload: Literal["generation"] = "generation"
    task: list[dict[str, Any]]
    engines: dict[str, dict[str, Any]]
    versus: list[dict[str, Any]]
    profiles: dict[str, Any]
    reports: dict[str, dict[str, float | None]]
    long: dict[str, Any] | None = Field(None, description="workload.long: the long point's "
                                        "{prompt, new_tokens, engines, versus}, timed like the task.")
    scores: dict[str, Any] = Field(default_factory=dict, description="workload.chat: each recipe's "
                                   "task score and its PyTorch baseline's, B-vs-A answer accuracy "
                                   "(compare/generation_scores.py); {} without workload.chat.")
