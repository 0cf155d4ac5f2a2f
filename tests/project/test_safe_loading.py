"""Safe loading, proven on the source: no loader in pipeline/ can execute what it reads.

The AST of every module is searched for pickle-family imports, unsafe YAML loaders,
np.load without allow_pickle=False, torch.load without weights_only=True, and eval/exec.
The checker is itself checked on bad snippets, so it cannot pass by seeing nothing.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT

PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}
UNSAFE_YAML = {"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load", "full_load_all",
               "Loader", "UnsafeLoader", "FullLoader"}


def _keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name and isinstance(kw.value, ast.Constant):
            return kw.value.value
    return None


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def unsafe_uses(source: str, filename: str = "<src>") -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if a.name.split(".")[0] in PICKLE_MODULES]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[0] in PICKLE_MODULES:
                found.append(f"{where}: from {module} import")
            if module == "yaml" and any(a.name in UNSAFE_YAML for a in node.names):
                found.append(f"{where}: from yaml import an unsafe loader")
        elif isinstance(node, ast.Attribute) and _dotted(node.value) == "yaml" and node.attr in UNSAFE_YAML:
            found.append(f"{where}: yaml.{node.attr}")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name in ("np.load", "numpy.load") and _keyword(node, "allow_pickle") is not False:
                found.append(f"{where}: {name} without allow_pickle=False")
            elif name == "torch.load" and _keyword(node, "weights_only") is not True:
                found.append(f"{where}: torch.load without weights_only=True")
            elif name in ("eval", "exec") or name.endswith((".read_pickle", ".from_pickle")):
                found.append(f"{where}: {name}()")
    return found


def test_the_checker_finds_each_unsafe_form():
    bad = {
        "import pickle": 1, "from dill import loads": 1, "import yaml\nyaml.load(s)": 1,
        "import yaml\nyaml.load(s, Loader=yaml.FullLoader)": 2, "from yaml import unsafe_load": 1,
        "import numpy as np\nnp.load(p)": 1, "import numpy as np\nnp.load(p, allow_pickle=True)": 1,
        "import torch\ntorch.load(p)": 1, "import torch\ntorch.load(p, weights_only=False)": 1,
        "eval(s)": 1, "import pandas as pd\npd.read_pickle(p)": 1,
    }
    for source, count in bad.items():
        assert len(unsafe_uses(source)) == count, source
    ok = ("import yaml\nyaml.safe_load(s)\nimport numpy as np\nnp.load(p, allow_pickle=False)\n"
          "import torch\ntorch.load(p, weights_only=True)")
    assert unsafe_uses(ok) == []


def test_pipeline_uses_only_safe_loaders():
    files = sorted((ROOT / "pipeline").rglob("*.py"))
    assert len(files) > 20
    found = [hit for f in files for hit in unsafe_uses(f.read_text(), str(f.relative_to(ROOT)))]
    assert found == []
    text = "\n".join(f.read_text() for f in files)
    # the loaders that are there are the safe ones (the scan saw real code)
    assert "yaml.safe_load(" in text and "allow_pickle=False" in text


class _Payload:
    def __reduce__(self):
        return (open, ("PWNED", "w"))


def test_a_pickle_payload_in_an_npz_is_refused_not_executed(tmp_path, monkeypatch):
    from pipeline import data

    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "evil.npz", **{"in/0/x": np.array([_Payload()], dtype=object)})
    with np.load(tmp_path / "evil.npz", allow_pickle=True) as z:  # what an unsafe loader does
        z["in/0/x"]
    assert (tmp_path / "PWNED").exists()
    os.remove(tmp_path / "PWNED")
    from pipeline.core.errors import IntegrityError

    with pytest.raises(IntegrityError, match="holds Python objects"):  # read header first, never unpickled
        data.load_feeds(tmp_path / "evil.npz")
    assert not Path(tmp_path / "PWNED").exists()
