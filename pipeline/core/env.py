"""The environment the pipeline's own machinery reads: where its caches live, and Hugging Face
kept offline. One home, so a variable's name and default are written once.

Cache roots (per machine, never per recipe; a test points them at a temp folder):
  $PIPELINE_CACHE_DIR   default ~/.cache/engine-pipeline: the measured memory bandwidth
                        (bench/floor.py), TensorRT timing caches (backends/tensorrt.py)
  $PIPELINE_GGUF_CACHE  default ~/.cache/pipeline/gguf: GGUF checkpoints converted into
                        transformers folders (model/gguf.py)
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR = "PIPELINE_CACHE_DIR"
GGUF_CACHE = "PIPELINE_GGUF_CACHE"


def hf_offline() -> None:
    """Nothing is ever downloaded: HF_HUB_OFFLINE=1 unless the user set it. Call it before
    transformers (or huggingface_hub) is imported: the hub reads the variable at import."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def cache_root() -> Path:
    """$PIPELINE_CACHE_DIR, else ~/.cache/engine-pipeline: what is measured once per machine."""
    return Path(os.environ.get(CACHE_DIR) or Path.home() / ".cache" / "engine-pipeline")


def gguf_cache_root() -> Path:
    """$PIPELINE_GGUF_CACHE, else ~/.cache/pipeline/gguf: converted GGUF checkpoints."""
    return Path(os.environ.get(GGUF_CACHE) or Path.home() / ".cache" / "pipeline" / "gguf")
