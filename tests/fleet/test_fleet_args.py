"""Issue 39, item 18: `fleet --address` and `--timeout` checked before Ray starts (one
`Error:` line, exit 2, no traceback), the same address check on `fleet node` and `serve`;
and a fleet's local Ray (no --address) on loopback, gone with every process it started once
the command ends."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from tests.conftest import ROOT, scaled

BAD_ADDRESSES = ["not a host:xx", "head:", "head:0", "head:65536", "head:6379x", ":6379",
                 "ray://", "ray://bad host:10001", "[::1:6379", "[nothing]:6379", "-head:6379"]


def _refused(project, *args: str, words: tuple[str, ...]) -> None:
    result = project.run(*args, timeout=120)
    assert result.code == 2, (args, result.code, result.err)
    assert "Traceback" not in result.err, result.err
    assert len(result.error_lines) == 1, result.err
    for word in words:
        assert word in result.error_lines[0], (word, result.err)


@pytest.mark.parametrize("address", BAD_ADDRESSES)
def test_a_bad_address_is_one_line_before_ray_starts(project, address):
    _refused(project, "fleet", "standard", "--address", address, words=("--address", "not a Ray address"))


def test_the_address_check_holds_for_fleet_node_and_serve(project):
    _refused(project, "fleet", "node", "--address", "not a host:xx", words=("not a Ray address",))
    _refused(project, "serve", "standard", "--address", "head:xx", words=("not a Ray address",))
    for good in ("10.0.0.1:6379", "head-0.ray.svc.cluster.local:6379", "[::1]:6379"):
        result = project.run("fleet", "node", "--address", good)
        assert result.code == 0 and f"--address={good}" in result.out, result.err  # shell-quoted where it must be


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf", "-inf"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_refused(project, timeout):
    _refused(project, "fleet", "standard", "--timeout", timeout, words=("--timeout", "above 0"))


def _session(sid: int) -> list[psutil.Process]:
    alive = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except (OSError, psutil.Error):
            continue
    return alive


@pytest.mark.slow
def test_a_local_fleet_ray_is_stopped_with_every_process_it_started(project):
    """A kind no node advertises: the local Ray starts, is asked, and the command ends with
    exit 2; nothing of its session is left (the agents once lingered as orphans)."""
    pytest.importorskip("ray")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "fleet", "standard", "--devices",
                             "gpu-nvidia-h200"], cwd=project.path, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=scaled(300))
    assert proc.returncode == 2 and "device:gpu-nvidia-h200" in err, err
    assert not _session(proc.pid), [(p.pid, p.name()) for p in _session(proc.pid)]
