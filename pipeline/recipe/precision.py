"""Recipe schema of the `precision:` section (the precision stage, pipeline/precision)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from pipeline.recipe.base import Strict


class BudgetSpec(Strict):
    cosine_min: float = Field(0.999, ge=-1, le=1, description="Worst-feed cosine vs the FP32 graph.")
    top1_min: float | None = Field(
        None, ge=0, le=1, description="Top-1 agreement vs the FP32 graph (logit outputs)."
    )


class SensitivitySpec(Strict):
    enabled: bool = Field(False, description="Rank quantizable nodes by the error each causes alone.")
    auto_exclude: bool = Field(
        False, description="Keep the most sensitive nodes in float until `budget` is met; the "
        "report gives the time each node kept in float costs (its kernel time, int8 vs float)."
    )
    budget: BudgetSpec = Field(BudgetSpec(), description="Accuracy the quantized graph must keep.")
    samples: int = Field(4, ge=1, description="Calibration feeds the accuracy is measured on.")


class SmoothingSpec(Strict):
    """SmoothQuant (Xiao et al. 2023): per input channel j of a quantized MatMul, divide the
    activation by s_j and multiply the weight's row j by s_j (exact in float), with
    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha): activation outliers move into the weights,
    which are quantized per channel and take them better."""

    alpha: float = Field(0.5, ge=0, le=1, description="Migration strength: 0 leaves the "
                         "activations, 1 moves all of their range into the weights.")


class GptqSpec(Strict):
    """How GPTQ (int4_method gptq) orders the channels and sets each block's grid."""

    act_order: bool = Field(False, description="Round the input channels in order of falling "
                            "Hessian diagonal (the most used first, while the most channels are "
                            "left to take their error), each block's grid fixed beforehand from "
                            "the uncorrected weights (static groups: MatMulNBits' blocks stay "
                            "contiguous along K).")
    grid: Literal["minmax", "search"] = Field(
        "minmax", description="Each block's scale and zero point: `minmax` spans the block's "
        "range; `search` shrinks the range (1.0 to 0.6 in 21 steps) to the least rounding error "
        "weighted by the Hessian diagonal, as llama.cpp's and AutoGPTQ's weighted grids do.")
    sequential: int = Field(0, ge=0, description="0: every layer's Hessian from the float "
                            "graph in one run per feed. n > 0: the paper's order -- layers in graph "
                            "order, n at a time, each group's inputs taken with the layers before it "
                            "already rounded (one more run per group; SmolLM2 has 4 a block).")
    damp: float = Field(0.01, gt=0, le=1, description="Share of the Hessian's mean diagonal "
                        "added to it before inverting (X^T X of a few thousand tokens is near "
                        "singular).")


class AutoRoundSpec(Strict):
    """How AutoRound (int4_method autoround) fits each decoder layer's rounding."""

    iters: int = Field(200, ge=1, description="Signed-gradient steps per decoder layer (the "
                       "paper's default; each costs a forward and backward pass of one layer on "
                       "`sequences` calibration sequences).")
    lr: float | None = Field(None, gt=0, description="First step size, falling linearly to 0 "
                             "(default 1 / iters: a rounding offset moves at most 0.5 in all).")
    sequences: int = Field(4, ge=1, description="Calibration sequences a step.")
    max_tokens: int = Field(128, ge=8, description="A longer calibration sequence is cut into "
                            "pieces of this many tokens, each a sequence of its own (AutoRound crops "
                            "its text the same way): many short pieces fit what a layer sees better "
                            "than a few long ones, at the same cost a step (SmolLM2, fitted on 7,735 "
                            "tokens of chats in 128-token pieces: a layer's output error on other "
                            "chats 4-8x under round-to-nearest's; on 1,433 tokens, 2x).")
    seed: int = Field(0, description="Seeds the order the sequences are drawn in.")


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
    scheme: Literal["static", "dynamic"] = Field(
        "static", description="int8: `static` calibrated Q/DQ on activations and weights (what "
        "TensorRT builds); `dynamic` int8 weights with activations quantized at run time "
        "(ONNX Runtime's DynamicQuantizeLinear + MatMulInteger, or fused forms), no calibration "
        "needed unless `smoothing` is set.",
    )
    smoothing: SmoothingSpec | None = Field(
        None, description="int8: SmoothQuant activation smoothing before quantization (needs "
        "calibration data for the activation ranges).",
    )
    weight_range: Literal["auto", "full", "reduced"] = Field(
        "auto", description="int8 weights: `full` [-127, 127]; `reduced` 7 bits [-64, 63], which "
        "x86 CPUs without VNNI need (their u8 x s8 kernel, VPMADDUBSW, saturates int16 pair sums "
        "of full-range weights); `auto` reduced only where the machine lacks VNNI.",
    )
    calibration: Literal["minmax", "percentile", "entropy", "distribution"] | None = Field(
        None, description="int8/fp8 calibration method; default minmax (int8), distribution (fp8).",
    )
    percentile: float = Field(99.999, gt=50, le=100, description="Percentile kept by `percentile`.")
    op_types: list[Literal["MatMul", "Gemm", "Conv", "Add", "Attention"]] = Field(
        ["MatMul", "Gemm", "Conv"], min_length=1,
        description="Op types quantized (int8/fp8; int4 takes MatMul/Gemm weights). `Add` adds "
        "the residual adds (static); `Attention` the fused attention's QKV projection (dynamic: "
        "QAttention, where ONNX Runtime's kernel takes the node's inputs).",
    )
    per_channel: bool = Field(True, description="int8: one weight scale per output channel.")
    exclude: list[str] = Field(
        [], description="Nodes kept in float: exact node names or regexes (full match). A pattern "
        "that matches no quantizable node is an error.",
    )
    fallback: Literal["float", "blockwise"] = Field(
        "float", description="int8 dynamic: what an excluded MatMul (`exclude`, "
        "`sensitivity.auto_exclude`) runs as. `float`: FP32. `blockwise`: ONNX Runtime's "
        "MatMulNBits, int8 weights per block of 128 along K and activations quantized per block "
        "of each row at run time (accuracy_level 4): close to float's accuracy where one "
        "per-tensor activation range fails (a few tokens set it), in less of float's time.",
    )
    block_size: int = Field(32, ge=16, description="int4: weights per scale (a power of two).")
    int4_source: Literal["requantize", "checkpoint"] = Field(
        "requantize", description="int4: `requantize` quantizes the graph's float weights "
        "(symmetric blocks of `block_size`); `checkpoint` carries a GGUF checkpoint's own Q4_1 "
        "blocks (and Q8_0 ones) into MatMulNBits unchanged (model.transformers.gguf; block 32; "
        "Q4_1's minimums as a block-sum MatMul; ONNX Runtime only), so a quantized checkpoint is "
        "not quantized twice.")
    int4_method: Literal["rtn", "hqq", "hqq_uint8", "gptq", "autoround"] = Field(
        "rtn", description="int4, int4_source requantize: how the float weights become 4-bit "
        "blocks. `rtn`: symmetric round-to-nearest (Q/DQ, any backend); `hqq`: Half-Quadratic "
        "Quantization (ONNX Runtime's quantizer, no calibration data: per block the scale and "
        "zero point that minimize the weight error), written as MatMulNBits with float zero points "
        "(ONNX Runtime only; it runs them dequantized in fp32: keeps answers, costs speed -- "
        "benchmarks/results/hqq-vs-rtn-2026-12-06.md); `hqq_uint8`: HQQ's blocks with each zero "
        "point rounded to an integer and the block's codes and scale refit to the float weights, "
        "as MatMulNBits with uint8 zero points at accuracy_level 4 (MLAS' fast int4 path); "
        "`gptq`: GPTQ (pipeline/precision/gptq.py: each input channel rounded in turn, its error "
        "spread over the channels not yet rounded by the inverse Hessian of the inputs the layer "
        "sees on `data.calibration`; a decoder with a KV cache takes its `text` as prefills), "
        "asymmetric blocks with uint8 zero points at accuracy_level 4 (ONNX Runtime only); "
        "`autoround`: AutoRound (pipeline/precision/autoround.py: each decoder layer's rounding "
        "offsets and block ranges fitted in PyTorch to the layer's float output on "
        "`data.calibration`; a transformers model), the same MatMulNBits form.")
    int8_layers: list[str] = Field(
        [], description="int4, int4_source requantize: nodes (exact names or regexes, full match) "
        "written as 8-bit MatMulNBits blocks (128 along K, symmetric, accuracy_level 4) instead of "
        "4-bit, as llama.cpp's _M mixes keep the feed-forward down projection at 6 bits: the "
        "layers where 4 bits cost the most answers, at twice their 4-bit bytes. A pattern that "
        "matches no quantizable node is an error.")
    gptq: GptqSpec = Field(GptqSpec(), description="int4_method gptq: channel order, grid, damping.")
    autoround: AutoRoundSpec = Field(AutoRoundSpec(), description="int4_method autoround: steps, "
                                     "step size, sequences a step.")
    kv_cache: Literal["float32", "float16", "int8"] = Field(
        "float32", description="The KV cache's element type (a generation workload whose graph "
        "runs ONNX Runtime's GroupQueryAttention: optimize pass group_query_attention). `int8`: "
        "per-channel scales calibrated on workload.chat's held-out text, a quarter of float32's "
        "bytes per token; `float16`: half (no fast CPU path in ONNX Runtime 1.32: measured ~8x "
        "slower attention). The report shows what it costs in answers and perplexity.")
    sensitivity: SensitivitySpec = Field(SensitivitySpec(), description="Per-node sensitivity.")
    require_effective_precision: float | None = Field(
        None, gt=0, le=1, description="Least share of MatMul/Gemm FLOPs that ONNX Runtime must run "
        "in integer kernels after its graph optimization; below it the engine fails (exit 3).",
    )

    @field_validator("exclude", "int8_layers")
    @classmethod
    def _regexes(cls, patterns: list[str], info: ValidationInfo) -> list[str]:
        for p in patterns:
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"{info.field_name}: `{p}` is not a valid regex ({e})") from None
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
        if self.mode != "int8" and (self.scheme != "static" or self.smoothing is not None):
            raise ValueError(f"scheme and smoothing apply to int8, not mode {self.mode}")
        if self.scheme == "dynamic" and self.calibration is not None and self.smoothing is None:
            raise ValueError("scheme dynamic takes no calibration method (activations are "
                             "quantized at run time); drop precision.calibration")
        if self.scheme == "dynamic" and "Add" in self.op_types:
            raise ValueError("scheme dynamic quantizes MatMul, Gemm, Conv and Attention, not Add")
        if self.scheme == "static" and "Attention" in self.op_types:
            raise ValueError("op_types Attention needs scheme dynamic (QAttention); static Q/DQ "
                             "leaves fused attention in float")
        if self.fallback == "blockwise" and not (self.mode == "int8" and self.scheme == "dynamic"):
            raise ValueError("fallback blockwise applies to int8 with scheme dynamic (MatMulNBits "
                             "runs only in ONNX Runtime)")
        if self.int4_source == "checkpoint" and (self.mode != "int4" or self.block_size != 32):
            raise ValueError("int4_source checkpoint needs mode int4 with block_size 32 (the "
                             "checkpoint's Q4_1 blocks are 32 weights)")
        if self.int8_layers and (self.mode != "int4" or self.int4_source != "requantize"):
            raise ValueError("int8_layers applies to mode int4 with int4_source requantize")
        if self.gptq != GptqSpec() and self.int4_method != "gptq":
            raise ValueError("precision.gptq applies to int4_method gptq")
        if self.autoround != AutoRoundSpec() and self.int4_method != "autoround":
            raise ValueError("precision.autoround applies to int4_method autoround")
        if self.int4_method != "rtn" and (self.mode != "int4" or self.int4_source != "requantize"):
            raise ValueError("int4_method applies to mode int4 with int4_source requantize")
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two (got {self.block_size})")
        return self

    @property
    def needs_calibration(self) -> bool:
        """Static Q/DQ calibrates activation ranges; smoothing needs activation maxima; GPTQ
        the Hessian of each layer's inputs; AutoRound the layers' outputs."""
        return (self.mode in ("int8", "fp8") and (self.scheme == "static" or self.smoothing is not None)
                or self.mode == "int4" and self.int4_method in ("gptq", "autoround"))

    @property
    def method(self) -> str:
        return self.calibration or ("distribution" if self.mode == "fp8" else "minmax")
