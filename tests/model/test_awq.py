"""model/awq.py: activation-aware scales that keep the function and round with less loss."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def _tiny_llama_with_outlier_channels():
    """A grouped-query Llama whose norms make a few input channels 20x larger than the rest, as
    trained LLMs' are: the channels round-to-nearest serves worst."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight[[3, 17, 40]] = 20.0
    return model


def _fake_quantized(model):
    """A copy with every decoder linear rounded as the rtn route rounds it."""
    import copy

    from pipeline.model.awq import fake_quantize

    twin = copy.deepcopy(model)
    with torch.no_grad():
        for module in twin.model.layers.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(fake_quantize(module.weight))
    return twin


def test_fake_quantize_rounds_as_onnx_runtime_rtn_does():
    """The search is only as good as its model of the quantizer: ONNX Runtime's own symmetric
    blockwise int4 (the rtn route's MatMulNBitsQuantizer, QDQ form) gives the same weights."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from pipeline.model.awq import fake_quantize

    k, n = 64, 24
    weight = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)  # ONNX's [K, N]
    weight[5, 3] = 0.0
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "W"], ["Y"])], "one",
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "W")])
    quantizer = MatMulNBitsQuantizer(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                                     block_size=32, is_symmetric=True, quant_format=QuantFormat.QDQ)
    quantizer.process()
    session = ort.InferenceSession(quantizer.model.model.SerializeToString(), providers=["CPUExecutionProvider"])
    (rounded,) = session.run(None, {"A": np.eye(k, dtype=np.float32)})  # [K, N]: the weights it uses
    ours = fake_quantize(torch.from_numpy(weight.T.copy())).numpy().T  # torch's [N, K] and back
    # ONNX Runtime fuses DQ -> MatMul into MatMulNBits, whose sums leave ~1e-7 (steps are ~0.1)
    np.testing.assert_allclose(ours, rounded, rtol=1e-6, atol=1e-6)
    assert not np.allclose(rounded, weight)  # it did round


def test_the_scales_keep_the_function_and_cut_the_rounding_loss():
    from pipeline.model.awq import awq_scale

    model = _tiny_llama_with_outlier_channels()
    ids = torch.randint(0, 96, (1, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = model(ids).logits
        plain_loss = (_fake_quantized(model)(ids).logits - reference).pow(2).mean()
        before = model.model.layers[0].mlp.gate_proj.weight.clone()
        assert awq_scale(model, ids) == 3 * 2
        torch.testing.assert_close(model(ids).logits, reference, rtol=1e-4, atol=1e-4)
        scaled_loss = (_fake_quantized(model)(ids).logits - reference).pow(2).mean()
    assert not torch.equal(model.model.layers[0].mlp.gate_proj.weight, before)  # scales were chosen
    assert scaled_loss < 0.7 * plain_loss, (float(scaled_loss), float(plain_loss))


def test_an_input_size_off_the_block_is_a_recipe_error():
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.core.errors import RecipeError
    from pipeline.model.awq import awq_scale

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=48, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(RecipeError, match="multiple of 32"):
        awq_scale(model, torch.zeros((1, 4), dtype=torch.long))


def test_the_scales_need_a_gguf_checkpoint():
    from pydantic import ValidationError

    from pipeline.recipe.schema import TransformersSpec

    with pytest.raises(ValidationError, match="awq applies to a `gguf` checkpoint"):
        TransformersSpec(pretrained="some/dir", awq=True)


def test_the_scales_are_refused_with_a_rounding_they_were_not_searched_for():
    """AWQ's scales fit rtn's rounding; with HQQ's they cost answers (52/129 against 73)."""
    from pipeline import recipe as recipe_mod
    from pipeline.core.errors import RecipeError

    assert recipe_mod.load("smollm2-float-int4-awq").model.transformers.awq
    with pytest.raises(RecipeError, match=r"model\.transformers\.awq: the scales are searched for"):
        recipe_mod.load("smollm2-float-int4-awq", ["precision.int4_method=hqq"])
