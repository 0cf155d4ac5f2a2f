"""A local `pipeline serve` (and every test that serves) starts a Ray of its own, even with
another Ray running on the machine: `ray start --head` as docs/fleet.md teaches, whose
`ray_current_cluster` note a plain `ray.init()` would join (and then refuse `num_cpus` with
a ValueError), as two xdist workers' Rays once met in `make test`; and its workers (Serve's
processes) start with Serve's gRPC data plane on."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import scaled

pytestmark = pytest.mark.slow


def test_a_local_ray_is_our_own_beside_a_running_ray_start(monkeypatch):
    pytest.importorskip("ray.serve")
    import ray

    from pipeline.serving.app import SERVE_DATA_PLANE_ENV, free_port, local_ray

    other_tmp = tempfile.mkdtemp(prefix="rayo", dir="/tmp")  # short: Ray's sockets live in it
    env = {**os.environ, "RAY_TMPDIR": other_tmp, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    ray_cli = Path(sys.executable).with_name("ray")
    # --block: the head lives as long as this process group, stopped below without `ray stop`
    # (which would stop every Ray of this user, another test's too)
    head = subprocess.Popen([str(ray_cli), "start", "--head", "--block", f"--port={free_port()}",
                             "--num-cpus=0", "--include-dashboard=false"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        note = Path(other_tmp) / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + scaled(120)
        while not note.exists():  # written once the head's GCS is up
            assert head.poll() is None, "ray start --head exited"
            assert time.monotonic() < deadline, "ray start --head wrote no ray_current_cluster note"
            time.sleep(0.2)
        other = note.read_text().strip()
        monkeypatch.setenv("RAY_TMPDIR", other_tmp)  # where a plain ray.init() looks for it
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        monkeypatch.delenv("RAY_SERVE_USE_GRPC_BY_DEFAULT", raising=False)
        with local_ray(num_cpus=1):
            ours = ray.get_runtime_context().gcs_address
            assert ours != other and ray.cluster_resources().get("CPU") == 1
            # Serve's processes are workers of our node: they read the gRPC data plane setting
            # (app.SERVE_DATA_PLANE_ENV), while this process's environment is its own again
            seen = ray.get(ray.remote(num_cpus=0)(_environ).remote(list(SERVE_DATA_PLANE_ENV)))
            assert seen == SERVE_DATA_PLANE_ENV
            assert not any(k in os.environ for k in SERVE_DATA_PLANE_ENV)
        assert head.poll() is None  # the other Ray was left alone
    finally:
        _kill_tree(head)
        shutil.rmtree(other_tmp, ignore_errors=True)


def _environ(names: list[str]) -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in names}


def _kill_tree(head: subprocess.Popen) -> None:
    """SIGKILL to `ray start --head` and every process under it: its GCS, raylet and agents
    are in its process group, a worker may have one of its own. (A SIGTERM to the group took
    33 of the test's 48 s: `ray start --block` stops its processes one by one, gracefully.)"""
    import psutil

    tree = [psutil.Process(head.pid), *psutil.Process(head.pid).children(recursive=True)]
    os.killpg(head.pid, signal.SIGKILL)
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    head.wait(timeout=scaled(60))
    _, alive = psutil.wait_procs(tree, timeout=scaled(60))
    assert not alive, alive
