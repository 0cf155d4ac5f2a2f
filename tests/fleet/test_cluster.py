"""`pipeline fleet` on a real local multi-node Ray cluster (ray.cluster_utils.Cluster).

Four nodes on this machine: a head with no device, two nodes advertising this machine's
device kind (A) and one advertising another kind (B), simulated by the device override the
stage cache honours (PIPELINE_DEVICE_OVERRIDE in that raylet's environment, so its workers
really report kind B). Each job runs the real `pipeline run standard` with the suite's fast
protocol settings. The tests share the cluster and build on each other in file order:
placement, a killed worker, a tampered transfer, a node lost mid-job, then reuse on a new
node of everything the first build made on another.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from pipeline.core import deps
from pipeline.core.errors import IntegrityError
from pipeline.fleet import jobs, kinds, run, transfer
from pipeline.store.folder_names import overrides_digest
from pipeline.store.recipe_folder import Store
from tests.conftest import FAST, ROOT, Project

KIND_A = kinds.here()
KIND_B = "cpu-avx2" if KIND_A != "cpu-avx2" else "cpu-avx512_vnni"
DEVICE_B = {"cpu_isa": ["avx2"]} if KIND_B == "cpu-avx2" else {"cpu_isa": ["avx2", "avx512f", "avx512_vnni"]}
VALUES = tuple(FAST[i + 1] for i, a in enumerate(FAST) if a == "--set")
FOLDER = f"standard@{overrides_digest(VALUES)}"


def test_kinds_name_devices_and_resources():
    assert kinds.kind_of({"cpu_isa": ["avx2", "avx512f", "avx512_vnni"], "gpu": None}) == "cpu-avx512_vnni"
    assert kinds.kind_of({"cpu_isa": ["avx2"]}) == "cpu-avx2"
    assert kinds.kind_of({"cpu_isa": []}) == "cpu-base"
    assert kinds.kind_of({"cpu_isa": ["avx2"], "gpu": "NVIDIA H200"}) == "gpu-nvidia-h200"
    assert kinds.resource("gpu-nvidia-h200") == "device:gpu-nvidia-h200"
    assert kinds.kinds_of({"CPU": 2, "device:cpu-avx2": 1, "node:1.2.3.4": 1}) == ["cpu-avx2"]
    assert kinds.problem("cpu-avx2") is None and "not `cpu-<isa>`" in kinds.problem("CPU AVX2")
    line = kinds.start_line("cpu-avx2", "10.0.0.1:6379")
    assert line == "ray start --address=10.0.0.1:6379 '--resources={\"device:cpu-avx2\": 1}'"


@contextlib.contextmanager
def _ray_tmpdir():
    """Ray's session files (and its `ray_current_cluster` note) in a folder of our own, short
    enough for its unix sockets, so that another Ray on this machine is never touched; and
    time for a raylet to register on a loaded machine (Ray's default is 30 s)."""
    folder = tempfile.mkdtemp(prefix="rayf", dir="/tmp")
    values = {"RAY_TMPDIR": folder, "RAY_raylet_start_wait_time_s": "180"}
    old = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in old.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    with _ray_tmpdir():
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        try:
            a = [c.add_node(num_cpus=1, resources={kinds.resource(KIND_A): 1}) for _ in range(2)]
            b = c.add_node(num_cpus=1, resources={kinds.resource(KIND_B): 1},
                           env_vars={deps.DEVICE_OVERRIDE: json.dumps(DEVICE_B)})
            c.wait_for_nodes(timeout=180)
            yield c, {KIND_A: a, KIND_B: [b]}
        finally:
            c.shutdown()


@pytest.fixture(scope="module")
def proj(tmp_path_factory) -> Project:
    return Project(tmp_path_factory.mktemp("fleet"))


def _build(proj, cluster, wanted, fleet_cls=jobs.Fleet, on_event=None, values=VALUES):
    with contextlib.chdir(proj.path):
        return run.build(["standard"], False, cluster[0].address, wanted, 600, Path("engines"),
                         values, fleet_cls=fleet_cls, on_event=on_event)


def _node_ids(cluster, kind) -> set[str]:
    return {n.node_id for n in cluster[1][kind]}


def _accepted(proj, kind) -> Store:
    folder = proj.engines / "fleet" / kind / FOLDER
    store = Store(folder.parent, folder.name)
    store.verify_all()
    return store


@pytest.fixture(scope="module")
def first(proj, cluster):
    return _build(proj, cluster, [KIND_A, KIND_B])


def test_each_pair_runs_on_a_node_of_its_kind(first, proj, cluster):
    assert first.exit_code == 0, first
    by_kind = {p.kind: p for p in first.pairs}
    assert set(by_kind) == {KIND_A, KIND_B}
    for kind, pair in by_kind.items():
        # a busy machine may fail a first attempt (the fleet retries it, as it would a lost
        # node); every attempt ran on a node of its kind and the last was accepted
        *earlier, attempt = pair.attempts
        assert all(a.outcome != "accepted" and (a.reason or a.exit_code) for a in earlier), earlier
        assert all(a.node_id in _node_ids(cluster, kind) for a in earlier if a.node_id), earlier
        assert attempt.outcome == "accepted" and attempt.node_id in _node_ids(cluster, kind)
        assert attempt.kind_found == kind
        assert pair.status == "done" and pair.built and not pair.reused
        assert pair.engines[0].gates and all(g.passed for g in pair.engines[0].gates)
        assert pair.folder == f"engines/fleet/{kind}/{FOLDER}"
    # the B node's run really saw its device: the report says so
    report_b = _accepted(proj, KIND_B).read_json("report.json")
    assert report_b["device"]["cpu_isa"] == DEVICE_B["cpu_isa"]
    assert _accepted(proj, KIND_A).read_json("report.json")["device"]["cpu_isa"] == deps.device()["cpu_isa"]
    assert run.read(proj.engines / "fleet" / "fleet.json") == first
    compare = proj.run("fleet", "compare", FOLDER)
    assert compare.code == 0, compare.err
    assert KIND_A in compare.out and KIND_B in compare.out and "onnxruntime" in compare.out


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _gone(pid: int, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            return True
        if state == "Z":  # exited, not yet reaped by its (dead) parent's reaper
            return True
        time.sleep(0.05)
    return False


def test_a_killed_worker_is_retried_on_another_node_and_the_rest_go_on(first, proj, cluster):
    killed = []

    def kill_when_building(event):
        """The worker dies once its `pipeline run` child is running (polled, not slept on)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _children(event["pid"]):
            time.sleep(0.02)
        children = _children(event["pid"])
        os.kill(event["pid"], signal.SIGKILL)
        killed.append({**event, "children": children})

    def on_event(event):
        if event["pair"].endswith(f"@{KIND_A}") and event["attempt"] == 1:
            threading.Thread(target=kill_when_building, args=(event,)).start()

    outcome = _build(proj, cluster, [KIND_A, KIND_B], on_event=on_event)
    assert len(killed) == 1 and killed[0]["children"], killed  # killed mid-build
    assert all(_gone(child) for child in killed[0]["children"])  # its build died with it
    assert outcome.exit_code == 0, outcome
    by_kind = {p.kind: p for p in outcome.pairs}
    lost, retried = by_kind[KIND_A].attempts
    assert lost.outcome == "lost" and lost.node_id == killed[0]["node_id"], lost
    assert retried.outcome == "accepted" and retried.node_id in _node_ids(cluster, KIND_A) - {lost.node_id}
    assert [a.outcome for a in by_kind[KIND_B].attempts] == ["accepted"]  # untouched
    _accepted(proj, KIND_A)


def test_a_tampered_transfer_is_refused_then_retried(first, proj, cluster):
    class Tampering(jobs.Fleet):
        tampered = 0

        def receive(self, job, result):
            if result.packed is not None and not Tampering.tampered:
                Tampering.tampered += 1
                data = bytearray(result.packed.files["model.onnx"])
                data[len(data) // 2] ^= 0xFF
                result.packed.files["model.onnx"] = bytes(data)
            return result

    outcome = _build(proj, cluster, [KIND_A], fleet_cls=Tampering)
    (pair,) = outcome.pairs
    refused, accepted = pair.attempts
    assert refused.outcome == "refused" and "model.onnx" in refused.reason, refused
    assert "does not match the manifest" in refused.reason
    assert accepted.outcome == "accepted" and outcome.exit_code == 0
    _accepted(proj, KIND_A)


def test_accept_refuses_a_corrupt_or_partial_folder_and_keeps_the_one_before(first, proj):
    store = _accepted(proj, KIND_A)
    before = {p.name: p.read_bytes() for p in store.dir.iterdir()}
    packed = transfer.pack(store.dir)
    name = next(n for n in packed.files if n.endswith(".json"))
    for broken in (
        transfer.Packed(packed.folder, packed.manifest, {**packed.files, name: packed.files[name] + b" "}),
        transfer.Packed(packed.folder, packed.manifest, {k: v for k, v in packed.files.items() if k != name}),
        transfer.Packed(packed.folder, packed.manifest, {**packed.files, "extra.bin": b"x"}),
        transfer.Packed(packed.folder, b"{not json", packed.files),
    ):
        with pytest.raises(IntegrityError):
            transfer.accept(broken, store.dir, "test")
        assert {p.name: p.read_bytes() for p in store.dir.iterdir()} == before
    assert not [p for p in store.dir.parent.iterdir() if p.name.startswith(".")]


def test_a_node_lost_mid_job_is_retried_on_another(first, proj, cluster):
    c, nodes = cluster
    lost_nodes = []

    def remove_when_building(event):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _children(event["pid"]):
            time.sleep(0.02)
        node = next(n for n in nodes[KIND_A] if n.node_id == event["node_id"])
        c.remove_node(node)  # its raylet and workers go, the job's `pipeline run` with them
        nodes[KIND_A].remove(node)
        lost_nodes.append(node.node_id)

    trackers = []

    def on_event(event):
        if event["attempt"] == 1:
            # the GCS's table: the state API (ray.util.state) needs a dashboard
            from ray._private.state import actors

            trackers.extend(a["Address"]["NodeID"] for a in actors().values() if a["ActorClassName"] == "Tracker")
            threading.Thread(target=remove_when_building, args=(event,)).start()

    # another folder (one --set value more): the job builds, not only reuses what the tests
    # before accepted, so its `pipeline run` runs for seconds, not the ~1 s a thread polling
    # for it on a loaded machine could miss
    other = tuple("validate.latency.warmup=6" if v == "validate.latency.warmup=5" else v for v in VALUES)
    assert other != VALUES
    outcome = _build(proj, cluster, [KIND_A], on_event=on_event, values=other)
    # the progress tracker lives on the driver's (head) node, never on one that can be lost
    assert trackers and set(trackers) == {c.head_node.node_id}
    (pair,) = outcome.pairs
    lost, retried = pair.attempts
    assert lost.outcome == "lost" and lost.node_id == lost_nodes[0], pair
    assert retried.outcome == "accepted" and retried.node_id == nodes[KIND_A][0].node_id
    assert outcome.exit_code == 0


def test_stages_built_on_another_node_are_reused_on_a_new_one(first, proj, cluster):
    c, nodes = cluster
    built = {a.node_id for p in first.pairs if p.kind == KIND_A for a in p.attempts}
    fresh = c.add_node(num_cpus=1, resources={kinds.resource(KIND_A): 1})
    for node in list(nodes[KIND_A]):  # only the new node is left of this kind
        c.remove_node(node)
        nodes[KIND_A].remove(node)
    nodes[KIND_A].append(fresh)
    c.wait_for_nodes(timeout=180)
    # --ship: the project folder travels as Ray's working_dir; the job runs from that copy
    result = proj.run("fleet", *FAST, "standard", "--address", c.address, "--devices", KIND_A,
                      "--ship", env={"RAY_TMPDIR": os.environ["RAY_TMPDIR"]})
    assert result.code == 0, result.err
    (pair,) = run.read(proj.engines / "fleet" / "fleet.json").pairs
    (attempt,) = pair.attempts
    assert attempt.node_id == fresh.node_id and fresh.node_id not in built
    # every stage of the folder built on another node in the first build is reused here
    assert pair.built == [] and "export" in pair.reused and "report" in pair.reused, pair
    shipped = list(Path(os.environ["RAY_TMPDIR"]).rglob("working_dir_files/*/recipes/standard.yaml"))
    assert shipped and not list(shipped[0].parent.parent.glob("engines")), shipped


def test_fleet_refuses_a_kind_no_node_has_and_bad_input(proj, cluster):
    # no --address: a local Ray of this machine's kind is started, asked, and stopped
    result = proj.run("fleet", "standard", "--devices", "gpu-nvidia-h200",
                      env={"RAY_TMPDIR": os.environ["RAY_TMPDIR"]})
    assert result.code == 2 and "device:gpu-nvidia-h200" in result.err and "fleet node" in result.err
    assert f"advertised: {KIND_A}" in result.err, result.err
    assert proj.run("fleet", "standard", "--devices", "AVX2").code == 2
    assert proj.run("fleet", "no-such-recipe").code == 2
    debug = proj.run("fleet", "no-such-recipe", "--debug")
    assert debug.code == 2 and "Traceback" in debug.err and len(debug.error_lines) == 1
    assert proj.run("fleet", "--devices", KIND_A).code == 2  # no recipe named


def test_fleet_node_prints_the_ray_start_line_of_its_kind(project):
    result = project.run("fleet", "node", "--address", "10.0.0.1:6379")
    assert result.code == 0, result.err
    assert f"device kind {KIND_A}" in result.out
    assert f"ray start --address=10.0.0.1:6379 '--resources={{\"device:{KIND_A}\": 1}}'" in result.out
    assert project.run("fleet", "node", "--kind", "Not A Kind").code == 2


def test_a_killed_jobs_work_folder_is_swept_by_the_next_job():
    from pipeline.fleet import worker

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    orphan = Path(tempfile.mkdtemp(prefix=f"pipeline-fleet-{dead}-"))
    alive = Path(tempfile.mkdtemp(prefix=f"pipeline-fleet-{os.getpid()}-"))
    try:
        worker._sweep_orphans()
        assert not orphan.exists() and alive.is_dir()
    finally:
        shutil.rmtree(orphan, ignore_errors=True)
        shutil.rmtree(alive, ignore_errors=True)


def test_fleet_help_imports_no_ray():
    code = "import sys; from pipeline.cli import cli; assert 'ray' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
