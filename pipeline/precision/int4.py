"""INT4 weight-only, block-wise: the 4-bit case of flash models.

Form chosen: DequantizeLinear with int4 weights and `block_size` (opset 21) feeding the
float MatMul, i.e. ONNX Runtime's MatMulNBitsQuantizer with quant_format=QDQ, rather than
its com.microsoft MatMulNBits op. Reasons: the QDQ form is standard ONNX, which TensorRT
parses (INT4 weight-only GEMM from block-quantized DequantizeLinear) while it has no
MatMulNBits; and ONNX Runtime runs it anyway, fusing DequantizeLinear -> MatMul into its
MatMulNBits kernel during graph optimization (checked by effective.py on the engine).
Symmetric blocks (zero point 0), one FP32 scale per `block_size` weights along K.
Activations stay float in this graph, but not necessarily in the engine: ORT's fusion writes
MatMulNBits with accuracy_level 4 by default (session config
`session.qdq_matmulnbits_accuracy_level`), which quantizes each MatMul's activations to int8
per block at run time. effective.py reads the level from the engine and reports it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from pipeline.core.errors import StageFailed
from pipeline.precision import calibrate, dynamic, nodes


def untranspose_weights(model) -> int:
    """FusedMatMul(x, W, transB=1) with a constant W -> MatMul(x, W^T), in place; returns how many.

    A tied LM head reads the token embedding transposed; `ort_fusions` folds that Transpose
    into a FusedMatMul, which no INT4 quantizer takes, so the largest weight of a small chat
    model (SmolLM2: 49152 x 576) stayed float and every decode step read it in FP32. The
    transposed copy is what gets quantized; the embedding itself stays for its Gather."""
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    done = 0
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "FusedMatMul" or node.domain != "com.microsoft" or len(node.input) != 2
                or node.input[1] not in inits or attrs.get("transB") != 1 or attrs.get("transA", 0)
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("transBatchA", 0) or attrs.get("transBatchB", 0)
                or len(inits[node.input[1]].dims) != 2):
            continue
        name = f"{node.input[1]}/transposed"
        if name not in inits:
            inits[name] = numpy_helper.from_array(numpy_helper.to_array(inits[node.input[1]]).T.copy(), name)
            model.graph.initializer.append(inits[name])
        node.op_type, node.domain = "MatMul", ""
        node.input[1] = name
        del node.attribute[:]
        done += 1
    return done


def checkpoint_file(recipe) -> Path:
    """The GGUF file of `model.transformers.gguf` (a path or `module:function`)."""
    from pipeline.core.errors import RecipeError

    ref = getattr(recipe.model.transformers, "gguf", None) if recipe.model.transformers else None
    if not ref:
        raise RecipeError(f"{recipe.where}: precision.int4_source checkpoint needs a GGUF model "
                          "(model.transformers.gguf)", "or use int4_source: requantize")
    try:
        from pipeline.recipe.gguf_header import resolve
    except ImportError:  # a plain path where the GGUF model source is not installed
        return Path(ref)
    return resolve(ref, recipe.where)


def apply(recipe, src: Path, workdir: Path, verbose: bool = False) -> tuple[Path, dict]:
    if recipe.precision.int4_source == "checkpoint":
        from pipeline.precision.checkpoint import from_checkpoint

        model = onnx.load(str(src))
        untransposed = untranspose_weights(model)
        meta = {**from_checkpoint(model, checkpoint_file(recipe)), "untransposed_weights": untransposed}
        if not meta["quantized_nodes"]:
            raise StageFailed(f"precision.int4_source checkpoint: no MatMul weight of the graph is a "
                              f"block-quantized tensor of {meta['checkpoint']}",
                              "is the model the checkpoint's? (or use int4_source: requantize)")
        out = workdir / "typed.onnx"
        onnx.save(model, str(out))
        return out, {"form": "MatMulNBits from the checkpoint's own blocks (Q4_1: 4-bit, scale d, "
                     "plus the blocks' minimums as a block-sum MatMul; Q8_0: 8-bit)", "block_size": 32, "weight_only": True, **meta}
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    spec = recipe.precision
    op_types = [op for op in spec.op_types if op in ("MatMul", "Gemm")] or ["MatMul"]
    model = onnx.load(str(src))
    untransposed = untranspose_weights(model)
    candidates = nodes.quantizable(model, op_types, weight_only=True)
    if not candidates:
        raise StageFailed(f"precision.mode int4: no {'/'.join(op_types)} node with a constant weight")
    excluded = nodes.excluded(candidates, spec.exclude)
    eight = [n for n in nodes.excluded(candidates, spec.int8_layers, "precision.int8_layers") if n not in excluded]
    skipped = excluded + eight  # by the 4-bit quantizer; `eight` become 8-bit blocks after it
    hqq = spec.int4_method in ("hqq", "hqq_uint8")
    gptq = spec.int4_method == "gptq"
    fitted = spec.int4_method == "autoround"
    asymmetric = gptq or fitted  # ORT's asymmetric RTN writes the nodes, whose blocks are then replaced
    nbits = hqq or asymmetric  # MatMulNBits written by the quantizer, not Q/DQ
    originals = _weights_of(model, candidates) if spec.int4_method in ("hqq_uint8", "gptq", "autoround") else {}
    hess, tokens, feeds, seconds, solved = {}, 0, [], 0.0, {}
    if gptq:  # the float graph's layer inputs on the recipe's calibration data
        from pipeline.precision import gptq as gptq_blocks

        feeds = calibrate.feeds(recipe)
        kept = set(candidates) - set(skipped)
        weights = {n.name: n.input[1] for n in model.graph.node if n.name in kept}
        (hess, tokens, solved), seconds = calibrate.timed(gptq_blocks.hessians, model, weights, feeds, spec.gptq,
                                                          originals, spec.block_size)
    if fitted:  # each decoder layer's rounding fitted in PyTorch to its float output
        from pipeline.precision import autoround

        feeds = calibrate.feeds(recipe)
        kept = set(candidates) - set(skipped)
        (blocks, unfitted, fits, tokens), seconds = calibrate.timed(
            _autoround, recipe, feeds, {n.input[1]: originals[n.input[1]] for n in model.graph.node if n.name in kept})
    with calibrate.quiet(verbose, workdir):
        if asymmetric:  # ORT's asymmetric RTN writes the nodes; GPTQ's or AutoRound's blocks replace theirs below
            from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig

            quantizer = MatMulNBitsQuantizer(
                model, block_size=spec.block_size, is_symmetric=False, accuracy_level=4,
                nodes_to_exclude=skipped, op_types_to_quantize=tuple(op_types),
                algo_config=DefaultWeightOnlyQuantConfig(
                    block_size=spec.block_size, is_symmetric=False, accuracy_level=4,
                    op_types_to_quantize=tuple(op_types)))
        elif hqq:  # asymmetric blocks whose scale and zero point minimize the weight error (HQQ)
            from onnxruntime.quantization.matmul_nbits_quantizer import HQQWeightOnlyQuantConfig

            quantizer = MatMulNBitsQuantizer(
                model, block_size=spec.block_size, is_symmetric=False, nodes_to_exclude=skipped,
                op_types_to_quantize=tuple(op_types), algo_config=HQQWeightOnlyQuantConfig(
                    block_size=spec.block_size, bits=4, op_types_to_quantize=tuple(op_types)))
        else:
            quantizer = MatMulNBitsQuantizer(
                model, block_size=spec.block_size, is_symmetric=True, nodes_to_exclude=skipped,
                quant_format=QuantFormat.QDQ, op_types_to_quantize=tuple(op_types),
            )
        _, quantize_seconds = calibrate.timed(quantizer.process)
        seconds += quantize_seconds
        refit = {}
        if gptq:
            refit, refit_seconds = calibrate.timed(gptq_blocks.apply, quantizer.model.model, originals, hess, spec.gptq,
                                                  solved)
            refit |= {"calibration_feeds": len(feeds), "calibration_tokens": tokens}
            seconds += refit_seconds
        elif fitted:
            refit = {"autoround_nodes": autoround.apply(quantizer.model.model, blocks), "accuracy_level": 4,
                     "autoround": spec.autoround.model_dump(), "calibration_feeds": len(feeds),
                     "calibration_tokens": tokens, "rounded_to_nearest": unfitted,
                     "layer_output_error": [{"layer": f.layer, "rtn": round(f.rtn, 7), "autoround": round(f.fitted, 7)}
                                            for f in fits]}
        elif originals:  # HQQ's float zero points -> uint8, the form MLAS' int4 kernels run fast
            from pipeline.precision.integer_zero import to_integer_zero_points

            refit, refit_seconds = calibrate.timed(to_integer_zero_points, quantizer.model.model, originals)
            seconds += refit_seconds
        out = workdir / "typed.onnx"
        quantizer.model.save_model_to_file(str(out))
        if eight:
            _, eight_seconds = calibrate.timed(dynamic.blockwise, out, eight, out)
            seconds += eight_seconds
    typed = onnx.load(str(out), load_external_data=False)
    blocked = [n for n in typed.graph.node if n.op_type == ("MatMulNBits" if nbits else "DequantizeLinear")
               and not n.name.endswith(dynamic.BLOCKWISE_SUFFIX)]
    return out, {
        "form": _FORMS[spec.int4_method],
        "source": "requantize",
        "method": spec.int4_method,
        "untransposed_weights": untransposed,
        "block_size": spec.block_size,
        "symmetric": not nbits,
        "weight_only": True,
        "quantizable_nodes": len(candidates),
        "quantized_nodes": len(blocked),
        "excluded": [{"node": n, "why": "recipe"} for n in excluded],
        "int8_nodes": eight,
        "seconds": round(seconds, 3),
        **refit,
    }


_FORMS = {"rtn": "DequantizeLinear int4, block-wise (opset 21) -> MatMul",
          "hqq": "MatMulNBits int4 with float zero points, HQQ (ONNX Runtime only)",
          "hqq_uint8": "MatMulNBits int4 with uint8 zero points: HQQ's blocks, zero points rounded "
                       "and codes and scales refit (ONNX Runtime only)",
          "gptq": "MatMulNBits int4 with uint8 zero points, GPTQ's blocks on the calibration data (ONNX Runtime only)",
          "autoround": "MatMulNBits int4 with uint8 zero points, AutoRound's blocks fitted to each decoder layer's "
                       "output on the calibration data (ONNX Runtime only)"}


def _autoround(recipe, feeds: list[dict], originals: dict[str, np.ndarray]):
    """AutoRound's blocks for the graph's float weights (`originals`: initializer -> [K, N]),
    fitted on the PyTorch model the recipe builds (its baseline) over the calibration feeds'
    token ids; the weights no decoder layer makes up; each layer's fit; the tokens."""
    import torch

    from pipeline.core.ui import console
    from pipeline.model import sources
    from pipeline.precision import autoround

    sequences = autoround.pieces([torch.from_numpy(np.asarray(f["input_ids"], np.int64)) for f in feeds],
                                 recipe.precision.autoround.max_tokens)
    fitted, fits = autoround.fit(sources.load(recipe), sequences, recipe.precision.block_size,
                                 recipe.precision.autoround, note=lambda line: console.print(f"  [dim]{line}[/]"))
    blocks, unfitted = autoround.onnx_blocks(originals, fitted)
    return blocks, unfitted, fits, sum(s.shape[-1] for s in sequences)


def _weights_of(model, names: list[str]) -> dict:
    """The constant weight (initializer name -> float array) of each named node."""
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    wanted = set(names)
    return {n.input[1]: numpy_helper.to_array(inits[n.input[1]]) for n in model.graph.node
            if n.name in wanted and n.input[1] in inits}
