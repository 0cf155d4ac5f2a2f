"""core/env.py: the one home of the cache roots and the offline switch; the same variables
and defaults as before, read where each cache is used."""

from __future__ import annotations

import os

from pipeline.core import env


def test_cache_roots_follow_their_variables_else_the_home_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PIPELINE_CACHE_DIR", raising=False)
    monkeypatch.delenv("PIPELINE_GGUF_CACHE", raising=False)
    assert env.cache_root() == tmp_path / "home" / ".cache" / "engine-pipeline"
    assert env.gguf_cache_root() == tmp_path / "home" / ".cache" / "pipeline" / "gguf"
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("PIPELINE_GGUF_CACHE", str(tmp_path / "g"))
    assert env.cache_root() == tmp_path / "c" and env.gguf_cache_root() == tmp_path / "g"

    from pipeline.backends import tensorrt
    from pipeline.bench import floor

    assert floor._cache_file() == tmp_path / "c" / "bandwidth.json"
    assert tensorrt.cache_dir() == tmp_path / "c" / "tensorrt"


def test_offline_is_a_default_the_user_may_override(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    env.hf_offline()
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    env.hf_offline()
    assert os.environ["HF_HUB_OFFLINE"] == "0"
