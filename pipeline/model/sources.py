"""The recipe's `model:` section -> a torch.nn.Module in eval mode.

Sources: a built-in zoo model, any `package.module:function` factory, or a Hugging Face
`transformers` model (pipeline/model/hf.py, offline). `check()` resolves
the source without building the model, so a factory that does not import fails before any
stage runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.core import deps, user_code
from pipeline.core.errors import InputError, PipelineError, RecipeError
from pipeline.core.text import first_line
from pipeline.recipe import ModelSpec, Recipe
from pipeline.zoo import ZOO

WeightShapes = dict[str, tuple]  # tensor name -> (dtype, shape), as a weights file's header says


def _factory(spec: ModelSpec, where: str, source: Path | None = None) -> Callable[..., Any]:
    """The builder function; a user module is searched beside the recipe, in the current
    directory, then the environment (user_code), as `python -m` would."""
    target = ZOO[spec.zoo][1] if spec.zoo else spec.factory
    return user_code.function(target, f"{where}: model.factory", source)


def _where(recipe: Recipe) -> str:
    return recipe.where


def check(recipe: Recipe) -> None:
    """Fail early, before any work and without importing torch for a zoo model: a factory
    imports (or transformers fits), and the weights file exists and is a readable safetensors
    file. Zoo builders are ours: not importing them keeps a fully cached rerun torch-free."""
    if recipe.model.transformers is not None:
        _check_transformers(recipe)
    elif recipe.model.factory is not None:
        _factory(recipe.model, _where(recipe), recipe.source)
    weights = recipe.model.weights
    if weights is not None:
        path = Path(weights)
        if not path.is_file():
            what = "is a folder, not a file" if path.is_dir() else "no such file"
            raise InputError(f"{_where(recipe)}: model.weights: {weights}: {what}")
        _weights_header(path, _where(recipe))


def code_digest(recipe: Recipe) -> str | None:
    """sha256 of the Python source that builds the model, for the stage cache keys: editing
    a zoo model or the user's factory module must rebuild, not reuse stale engines.

    Zoo models: every .py file of the zoo package; factories: the factory's module file
    (found without importing it); a GGUF checkpoint: the file's sha256 and the converter.
    Other transformers models are pinned by library version instead.
    """
    import hashlib

    hf = recipe.model.transformers
    if hf is not None and hf.gguf is not None:  # the checkpoint's bytes and how it is converted
        from pipeline.model import awq, calibration, gguf, prune, rescale

        path = gguf.resolve(hf.gguf, _where(recipe))
        transforms = (f":{hf.prune_ffn}:" + (f"{hf.rescale_channels}:" if hf.rescale_channels else "")
                      + ("awq:" if hf.awq else ""))
        code = [(prune, hf.prune_ffn), (rescale, hf.rescale_channels), (awq, hf.awq),  # the transforms' code
                (calibration, hf.prune_ffn or hf.awq)]
        return hashlib.sha256(f"{gguf.file_sha256(path)}{transforms}".encode() + Path(gguf.__file__).read_bytes()
                              + b"".join(Path(m.__file__).read_bytes() for m, used in code if used)).hexdigest()
    if recipe.model.zoo is not None:
        files = sorted(Path(__file__).parent.parent.joinpath("zoo").glob("*.py"))
    elif recipe.model.factory is not None:
        spec = user_code.find_spec(recipe.model.factory.partition(":")[0], recipe.source)
        if spec is None or not spec.origin or not Path(spec.origin).is_file():
            return None
        files = [Path(spec.origin)]
    else:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def load(recipe: Recipe):
    """Build the model (and load its weights), in eval mode, on the CPU."""
    import torch

    spec = recipe.model.transformers
    if spec is not None:
        from pipeline.model import hf

        pretrained = transformers_dir(spec, _where(recipe))
        model = hf.build(spec, [i.name for i in recipe.inputs][:len(HF_INPUTS)], pretrained, _where(recipe))
    else:
        fn = _factory(recipe.model, _where(recipe), recipe.source)
        with user_code.exits_refused(f"{_where(recipe)}: model.factory `{recipe.model.factory or recipe.model.zoo}`"):
            try:
                model = fn(**recipe.model.kwargs)
            except PipelineError:
                raise
            except Exception as e:  # the user's factory (or its kwargs) is the recipe's to fix
                raise RecipeError(
                    f"{_where(recipe)}: model.factory `{recipe.model.factory or recipe.model.zoo}` failed "
                    f"with model.kwargs {recipe.model.kwargs} ({first_line(e, with_type=True)})",
                    "rerun with --debug for the trace") from e
    if not isinstance(model, torch.nn.Module):
        raise RecipeError(
            f"{_where(recipe)}: model.factory returned {type(model).__name__}, not a torch.nn.Module"
        )
    check_signature(recipe, model)
    if recipe.model.weights is not None:
        _load_weights(model, Path(recipe.model.weights), _where(recipe))
    return model.eval()


def check_signature(recipe: Recipe, model) -> None:
    """The recipe's inputs are forward()'s parameters, in its order. Feeds are bound by
    position in PyTorch and by name in the ONNX graph (and in a server's client), so a recipe
    listing `key, query` for forward(query, key) would feed the ONNX input `key` to `query`
    and still pass every gate."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):  # a builtin or C++ forward: nothing to read
        return
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return  # forward(*args) names nothing
    named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [i.name for i in recipe.inputs]
    if recipe.workload.kv_cache:  # the KV-cache graph's inputs come from its wrapper;
        names = names[:1]  # the model itself takes input_ids
    if names == named[:len(names)]:
        return
    unknown = [n for n in names if n not in named]
    why = (f"forward() has no parameter {', '.join(f'`{n}`' for n in unknown)}" if unknown else
           "they are listed in another order")
    raise RecipeError(f"{_where(recipe)}: inputs {names} do not match "
                      f"{type(model).__name__}.forward({', '.join(named)}): {why}",
                      "list the inputs with forward()'s parameter names, in its order")


def vocab_size(recipe: Recipe) -> int | None:
    """Rows of the model's token embedding, where the recipe tells it without building the
    model (zoo GLM size, transformers config); None when unknown (a factory's model)."""
    spec = recipe.model
    if spec.zoo == "glm":
        from pipeline.zoo.glm_config import SIZES

        return SIZES[spec.kwargs.get("size", "tiny")][5]
    hf = spec.transformers
    if hf is None:
        return None
    if hf.config is not None:
        return hf.config.get("vocab_size") if isinstance(hf.config.get("vocab_size"), int) else None
    import json

    try:
        config = json.loads((transformers_dir(hf, _where(recipe)) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config.get("vocab_size") if isinstance(config.get("vocab_size"), int) else None


def _weights_header(path: Path, where: str) -> WeightShapes:
    """name -> (dtype, shape) from the safetensors header, reading no tensor data."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            return {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise InputError(f"{where}: model.weights: {path} is not a readable safetensors file "
                         f"({first_line(e)})",
                         "save it with safetensors.torch.save_file(model.state_dict(), path)") from None


def _kind(t) -> str:
    import torch

    if t.dtype == torch.bool:
        return "bool"
    return "float" if t.is_floating_point() else "complex" if t.is_complex() else "integer"


def _load_weights(model, path: Path, where: str) -> None:
    # safetensors holds plain tensors: no pickle, nothing executed while loading.
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise InputError(f"{where}: model.weights: {path} is not a readable safetensors file ({e})") from None
    expected = model.state_dict()
    # Checked here, not left to load_state_dict: it raises a bare RuntimeError on a shape and
    # silently casts integer tensors into float parameters. Shapes first: a checkpoint of
    # another model size is best explained by its first tensor that does not fit.
    for name, want in expected.items():
        got = state.get(name)
        if got is None:
            continue
        if tuple(got.shape) != tuple(want.shape):
            raise InputError(f"{where}: model.weights: {path}: `{name}` has shape {list(got.shape)}, "
                             f"the model's is {list(want.shape)}")
        if _kind(got) != _kind(want):
            raise InputError(f"{where}: model.weights: {path}: `{name}` is {got.dtype}, the model's "
                             f"is {want.dtype} ({_kind(want)} values needed)")
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise InputError(
            f"{where}: model.weights: {path} does not fit the model "
            f"(missing: {', '.join(missing[:3]) or 'none'}; unexpected: {', '.join(unexpected[:3]) or 'none'})"
        )
    model.load_state_dict(state, strict=True)


# ------------------------------------------------------------------ transformers (light checks)
HF_INPUTS = ("input_ids", "attention_mask")  # the forward() order pipeline/model/hf.py accepts


def transformers_dir(spec, where: str) -> Path | None:
    """The local transformers folder of a TransformersSpec: `pretrained`, or the converted
    `gguf` checkpoint (pipeline/model/gguf.py); None for a `config` (random weights)."""
    if spec.gguf is not None:
        from pipeline.model import gguf

        return gguf.folder(spec.gguf, where, spec.prune_ffn, spec.rescale_channels, spec.awq)
    return pretrained_dir(spec.pretrained, where) if spec.pretrained else None


def pretrained_dir(ref: str, where: str) -> Path:
    """The local model directory `ref` names: a path, or `module:function` returning one."""
    if user_code.is_function_ref(ref):
        path = Path(user_code.call_ref(ref, f"{where}: model.transformers.pretrained", "a model directory"))
    else:
        path = Path(ref)
    if not (path / "config.json").is_file():
        raise InputError(f"{where}: model.transformers.pretrained: {path} is not a model directory "
                         "(no config.json)", "give a local directory saved by save_pretrained()")
    return path


def _check_transformers(recipe: Recipe) -> None:
    where, spec = _where(recipe), recipe.model.transformers
    deps.require("transformers", "model.transformers")
    names = tuple(i.name for i in recipe.inputs)
    if recipe.workload.kv_cache:  # the KV-cache signature (recipe/workload.py)
        names = names[:1]
    if names not in (HF_INPUTS[:1], HF_INPUTS):
        raise RecipeError(f"{where}: inputs: a transformers model takes [input_ids] or "
                          f"[input_ids, attention_mask] (got {list(names)})")
    if spec.pretrained is not None:
        pretrained_dir(spec.pretrained, where)
    if spec.gguf is not None:
        from pipeline.model import gguf

        gguf.resolve(spec.gguf, where)
