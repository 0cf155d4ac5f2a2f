"""Ray stays home (issue 39, items 5-7): a real `pipeline serve` subprocess and its local Ray
listen on the loopback address only; a second `pipeline serve` on its port is refused in one
line before anything starts; SIGTERM while it serves stops it with exit 0, and SIGINT while it
starts with 130, each leaving no process of its session and no socket of it listening."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, scaled, wait_exit
from tests.serving.test_serve import FOLDER, tiny  # noqa: F401 - the shared tiny BERT build

pytestmark = pytest.mark.slow

SERVING = "Ctrl-C or SIGTERM stops it"  # the line `pipeline serve` prints once it serves
RECORD = f"{FOLDER}/serve-start-onnxruntime.json"


@dataclass
class Served:
    proc: subprocess.Popen
    port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _start(project, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("RAY_ADDRESS", None)
    with open(log, "wb") as out:
        # a session of its own: every process it and its Ray start can be found by it
        # a 1 ms batching window: the recipe's 30 s would hold the first request that long
        return subprocess.Popen([sys.executable, "-m", "pipeline", "serve", FOLDER, "--num-cpus", "1",
                                 "--port", str(port), "--set", "serve.max_queue_delay_us=1000"],
                                cwd=project.path, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(condition, proc: subprocess.Popen, log: Path, what: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + scaled(seconds)
    while not condition():
        assert proc.poll() is None, f"`pipeline serve` exited ({proc.returncode}):\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {what} within {scaled(seconds):.0f} s:\n{log.read_text()}"
        time.sleep(0.2)


def _session(sid: int) -> list[psutil.Process]:
    """The live processes of session `sid` (a zombie holds no socket and no memory: it waits
    only for whoever adopted it to read its exit code)."""
    found = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (OSError, psutil.Error):
            continue
    return found


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _listening(processes: list[psutil.Process]) -> list[tuple[int, str, str, int]]:
    """(pid, name, ip, port) of every listening TCP socket of `processes`."""
    rows = []
    for process in processes:
        try:
            rows += [(process.pid, process.name(), c.laddr.ip, c.laddr.port)
                     for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            continue
    return rows


def _is_loopback(ip: str) -> bool:
    """127.0.0.0/8 or ::1, also IPv4-mapped (::ffff:127.0.0.1: Ray's C++ servers on a
    dual-stack socket; Python 3.11's is_loopback says False for it)."""
    address = ipaddress.ip_address(ip.split("%")[0])
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def _held_since_before(ports: set[int], moment: float) -> list[tuple[int, int | None, str]]:
    """(port, pid, name) of each of `ports` still listening in a process that existed before
    `moment` (time.time()). Ports are ephemeral: once the server let one go, another test's Ray
    on another xdist worker may be given it; a process started after `moment` cannot hold a
    socket the server left open, so such a listener is reuse, not a leak."""
    held = []
    for c in psutil.net_connections(kind="inet"):
        if c.status != psutil.CONN_LISTEN or c.laddr.port not in ports:
            continue
        try:
            owner = psutil.Process(c.pid) if c.pid else None
            if owner is not None and owner.create_time() >= moment:
                continue
            held.append((c.laddr.port, c.pid, owner.name() if owner else "?"))
        except psutil.NoSuchProcess:
            continue  # gone since: it holds nothing now
    return held


@pytest.fixture(scope="module")
def served(tiny, tmp_path_factory):  # noqa: F811
    """`pipeline serve` of the tiny BERT, serving (its SERVING line printed)."""
    pytest.importorskip("ray.serve")
    from pipeline.serving.app import free_port

    port = free_port()
    log = tmp_path_factory.mktemp("ray-home") / "serve.log"
    proc = _start(tiny, port, log)
    try:
        _wait_for(lambda: SERVING in log.read_text(errors="replace"), proc, log, "serving line")
        yield Served(proc, port, log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_every_listening_socket_of_the_server_and_its_ray_is_on_loopback(served):
    rows = _listening(_session(served.proc.pid))
    print("\n".join(f"{pid:>7} {name:<30} {ip}:{port}" for pid, name, ip, port in rows))
    names = {name for _, name, _, _ in rows}
    # the server's HTTP port and Ray's own servers are all there: the check saw them
    assert ("127.0.0.1", served.port) in {(ip, port) for _, _, ip, port in rows}
    assert {"gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names
    assert any(name.startswith("ray::ServeReplica") for name in names)
    beyond = [row for row in rows if not _is_loopback(row[2])]
    assert not beyond, f"listening beyond loopback: {beyond}"


def test_a_second_serve_on_the_busy_port_is_refused_in_one_line(served, tiny):  # noqa: F811
    record = (tiny.path / "engines" / RECORD).read_bytes()
    result = tiny.run("serve", FOLDER, "--num-cpus", "1", "--port", str(served.port), timeout=120)
    assert result.code == 2, result.err
    assert result.error_lines == [f"Error: --port {served.port}: 127.0.0.1:{served.port} is already "
                                  "in use by another server (stop it, or pick another --port)"]
    assert "serving" not in result.out + result.err
    assert "Traceback" not in result.err
    assert (tiny.path / "engines" / RECORD).read_bytes() == record  # the first server's record
    assert served.proc.poll() is None  # and the first server still serves


def test_sigterm_while_serving_stops_it_with_exit_0_leaving_nothing_behind(served):
    processes = _session(served.proc.pid)
    ports = {port for *_, port in _listening(processes)}
    assert len(processes) >= 8 and served.port in ports  # Ray's processes were seen
    stopped_at = time.time()
    served.proc.send_signal(signal.SIGTERM)
    assert wait_exit(served.proc, 120) == 0, served.output()
    out = served.output()
    assert "Traceback" not in out and "SIGTERM received" not in out, out
    left = [(p.pid, p.name()) for p in processes if _alive(p)]
    assert not left and not _session(served.proc.pid), f"left behind: {left}"
    held = _held_since_before(ports, stopped_at)
    assert not held, f"ports of the stopped server still listen: {held}"


def test_sigint_while_it_starts_interrupts_it_with_130_leaving_nothing_behind(tiny, tmp_path):  # noqa: F811
    pytest.importorskip("ray.serve")
    from pipeline.serving.app import free_port

    log = tmp_path / "serve.log"
    proc = _start(tiny, free_port(), log)
    try:
        # Ray is starting: its raylet (started after the GCS) is up
        _wait_for(lambda: any(p.name() == "raylet" for p in _session(proc.pid)), proc, log, "raylet")
        processes = _session(proc.pid)
        proc.send_signal(signal.SIGINT)
        assert wait_exit(proc, 120) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "Interrupted" in log.read_text() and "Traceback" not in log.read_text(), log.read_text()
    assert SERVING not in log.read_text()
    left = [(p.pid, p.name()) for p in processes if _alive(p)]
    assert not left and not _session(proc.pid), f"left behind: {left}"


def test_sigterm_to_its_whole_process_group_also_stops_it_with_exit_0(tiny, tmp_path):  # noqa: F811
    """systemd's stop (KillMode=control-group) and `kill -TERM -PGID` reach Ray's GCS and
    raylet too: the server must not wait on them (Ray's GCS client ends the process after
    60 s, exit 1) and still leave nothing behind."""
    pytest.importorskip("ray.serve")
    from pipeline.serving.app import free_port

    log = tmp_path / "serve.log"
    proc = _start(tiny, free_port(), log)
    try:
        _wait_for(lambda: SERVING in log.read_text(errors="replace"), proc, log, "serving line")
        processes = _session(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)
        assert wait_exit(proc, 50) == 0, log.read_text()  # well within Ray's 60 s
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Serve's long-poll thread may log that Ray is gone; no second Ray may start from it
    assert "Started a local Ray instance" not in log.read_text().split(SERVING)[1], log.read_text()
    left = [(p.pid, p.name()) for p in processes if _alive(p)]
    assert not left and not _session(proc.pid), f"left behind: {left}"
