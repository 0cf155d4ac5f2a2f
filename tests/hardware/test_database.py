"""The hardware feature database: this machine measured once per device identity and read
back after, the specified entries' sources, and the small measuring kernels themselves."""

from __future__ import annotations

import json

import pytest


def _fake_entry(cpu: str = "test CPU"):
    from pipeline.hardware.entry import Bandwidth, HardwareEntry, Peak, Source

    return HardwareEntry(
        name="this", title=cpu, kind="cpu", provenance="measured",
        source=Source(document="test", date="2026-12-05"), cores=2,
        bandwidth=[Bandwidth(level="L2", bytes_per_s=9e10, threads=1),
                   Bandwidth(level="DRAM", bytes_per_s=2e10, threads=1),
                   Bandwidth(level="DRAM", bytes_per_s=1.5e10, threads=2)],  # a noisy 2-thread figure
        peaks=[Peak(dtype="fp32", ops_per_s=1e11, isa="AVX2 FMA", threads=1),
               Peak(dtype="fp32", ops_per_s=2e11, isa="AVX2 FMA", threads=2),
               Peak(dtype="fp16", isa="not present")],
        runtimes=["CPUExecutionProvider"])


def test_this_machine_is_measured_once_per_identity_then_read_back(tmp_path, monkeypatch):
    from pipeline.core import deps
    from pipeline.hardware import database

    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(database, "measure", lambda: calls.append(1) or _fake_entry())
    first = database.this_machine()
    assert not first.cached and len(calls) == 1
    again = database.this_machine()
    assert again.cached and again.entry == first.entry and len(calls) == 1
    (identity,) = json.loads((tmp_path / "hardware.json").read_text())
    assert json.loads(identity)["cpu"]  # keyed by the device identity, as bench/floor's bandwidth
    assert not database.this_machine(remeasure=True).cached and len(calls) == 2
    monkeypatch.setenv("PIPELINE_DEVICE_OVERRIDE", json.dumps({"cpu": "another CPU"}))
    deps.identity.cache_clear()
    try:
        assert not database.this_machine().cached and len(calls) == 3  # another identity: measured
        assert len(json.loads((tmp_path / "hardware.json").read_text())) == 2
    finally:
        monkeypatch.delenv("PIPELINE_DEVICE_OVERRIDE")
        deps.identity.cache_clear()


def test_a_floor_takes_the_best_figure_with_at_most_the_engines_threads():
    entry = _fake_entry()
    assert entry.memory("DRAM").bytes_per_s == 2e10  # 1 thread beat the noisy 2-thread run
    assert entry.memory("DRAM", threads=1).bytes_per_s == 2e10
    assert entry.peak("fp32", threads=1).ops_per_s == 1e11 and entry.peak("fp32").ops_per_s == 2e11
    assert entry.peak("fp16") is None and entry.peak("int8") is None  # not present / not measured
    assert entry.memory("L3").level == "DRAM"  # an unmeasured level: the outermost one


def test_specified_entries_name_their_source_and_are_dense():
    from pipeline.hardware import database, specified

    entries = specified.entries()
    assert {"a100", "h100", "h200", "l4", "l40s", "rtx4090"} <= {e.name for e in entries}
    assert sum(e.kind == "cpu" for e in entries) >= 2
    for e in entries:
        assert e.provenance == "specified" and e.source.url.startswith("https://") and e.source.date
        assert e.memory().bytes_per_s > 1e11 and e.peak("fp32").ops_per_s > 1e12
    h100 = specified.lookup("H100-SXM")
    assert h100.peak("bf16").ops_per_s == pytest.approx(989.5e12)  # 1,979 "with sparsity" halved
    assert h100.memory().bytes_per_s == pytest.approx(3.35e12)
    assert database.lookup("h200").entry.memory().bytes_per_s == pytest.approx(4.8e12)
    from pipeline.core.errors import InputError

    with pytest.raises(InputError, match="h100"):
        database.lookup("tpu-v9")


def test_cache_sizes_are_read_from_sys_and_assumed_where_missing(tmp_path):
    from pipeline.hardware import caches

    for i, (level, kind, size, shared) in enumerate([(1, "Data", "48K", "0"), (1, "Instruction", "32K", "0"),
                                                      (2, "Unified", "2048K", "0")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (d / name).write_text(f"{value}\n")
    found = caches.data_caches(tmp_path)
    assert [(c.level, c.size_bytes, c.source) for c in found] == [
        (1, 48 << 10, "/sys"), (2, 2 << 20, "/sys"), (3, 32 << 20, "assumed")]
    assert caches._cpu_count("0-3,8") == 5


def test_the_kernels_measure_something_real():
    from pipeline.hardware import probe_compute, probe_memory

    assert probe_memory.stream(64 << 10, threads=2, traffic=1 << 22, repeats=1) > 1e8
    sets = probe_memory.working_sets([_cache(1, 32 << 10), _cache(2, 1 << 20), _cache(3, 2 << 20)], threads=1)
    assert sets["L1"] == 16 << 10 and "L3" not in sets  # a 1 MiB L3 share would mostly hit L2
    assert probe_compute.int8_isa(frozenset({"avx2", "avx512bw", "avx512_vnni"})).startswith("AVX-512 VNNI")
    assert "saturating" in probe_compute.int8_isa(frozenset({"avx2"}))
    assert probe_compute.half_peaks(frozenset({"avx2"}), [1])[0].isa == "not present"


def _cache(level: int, size: int):
    from pipeline.hardware.caches import Cache

    return Cache(level, size, 1, "/sys")


def test_hw_command_reuses_the_cached_entry_and_prints_a_specified_one(project, tmp_path):
    from pipeline.hardware import database

    env = {"PIPELINE_CACHE_DIR": str(tmp_path / "cache")}
    path = tmp_path / "cache" / "hardware.json"
    path.parent.mkdir()
    path.write_text(json.dumps({database._identity(): _fake_entry().model_dump(mode="json")}))
    result = project.run("hw", env=env)
    assert result.code == 0, result.err
    assert "cached figures reused" in result.out and "measuring" not in result.err
    assert "DRAM" in result.out and "AVX2 FMA" in result.out and "not present" in result.out
    spec = project.run("hw", "--device", "h100", env=env)
    assert spec.code == 0 and "specified" in spec.out and "nvidia-tensor-core-gpu-datasheet" in spec.out
    listing = project.run("hw", "--list", env=env)
    assert listing.code == 0 and "rtx4090" in listing.out and "epyc-9654" in listing.out
