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
