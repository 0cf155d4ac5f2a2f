"""A Ray node of our own that stays home: every socket of it on the loopback address, no
dashboard, and every process it started gone when it stops.

Where Ray 2.60 binds (read in its source, seen with `ss -ltnp`): the node's address is
`services.get_node_ip_address()`, which is the loopback address only where "Ray clusters" are
off (`ray_constants.ENABLE_RAY_CLUSTER`, read at import from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER;
off by default on macOS and Windows). On Linux it is on, and then the GCS, the raylet and every
worker's gRPC server listen on `::`, the dashboard agent and the autoscaler monitor on
0.0.0.0, the runtime-env agent on the machine's address; `_node_ip_address="127.0.0.1"` alone
is rewritten to the machine's address (`services.resolve_ip_for_localhost`). With it off and
the node address 127.0.0.1, all of them listen on 127.0.0.1 (the C++ servers on
`::ffff:127.0.0.1`, the same address on a dual-stack socket), as tests/serving/test_ray_home.py
checks. Ray starts its dashboard head process even with `include_dashboard=False` (only its
usage-stats module loaded: `services.start_api_server`) and always starts the two agents and
the monitor; none can be left out through ray.init, so they run, on loopback.

Stopping: `ray.shutdown()` stops the processes the driver started (GCS, raylet, monitor,
dashboard, log monitor); the raylet's children (the agents, the workers) notice it gone on
their own time, and until then they are orphans that still listen (seen: 60 s). So the
processes Ray started are noted before the shutdown and waited for, and the stragglers ended;
so are those that write into our session folder (an agent started after we looked).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import tempfile
from dataclasses import dataclass, field

LOOPBACK = "127.0.0.1"
SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node address is loopback
STARTS = 3  # tries to start a local Ray (Ray's raylet has a fixed 30 s to register)
EXIT_WAIT_S = 10.0  # what a Ray process gets to end on its own after the shutdown
STRAY_ROUNDS = 4  # rounds of ending what is left of our node (its processes, then late agents)
# Serve's controller gives a starting HTTP proxy 5 s to say it is ready, three times, then
# kills it and `serve.start` fails (ActorDiedError): on a loaded 2-core machine a proxy took
# longer (2026-12-06, the suite beside a model build). The controller reads it from its
# environment, which the local node's processes inherit from ours.
PROXY_READY_S = "60"


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8 or ::1, also as an IPv4-mapped IPv6 address (Python 3.11's is_loopback
    says False for ::ffff:127.0.0.1)."""
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


@contextlib.contextmanager
def _loopback_only():
    """Ray's "no cluster" setting for this node: the environment its processes inherit, and
    the constant an already imported ray read from it (the driver resolves its address with
    it); both restored after."""
    from ray._private import ray_constants

    saved_env = os.environ.get(SINGLE_NODE_ENV)
    saved_constant = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[SINGLE_NODE_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_constant
        if saved_env is None:
            os.environ.pop(SINGLE_NODE_ENV, None)
        else:
            os.environ[SINGLE_NODE_ENV] = saved_env


@contextlib.contextmanager
def _inherited(values: dict[str, str]):
    """`values` in os.environ for the block, each name the environment does not set."""
    added = [k for k in values if k not in os.environ]
    os.environ.update({k: values[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def _children() -> set:
    import psutil

    return set(psutil.Process().children())


def _started_since(children_before: set) -> set:
    """The processes this process started since (its new children: Ray's GCS, raylet,
    monitor, dashboard, log monitor) and theirs (the agents, the workers); not those of a
    child it already had (a `ray start --head` beside us, whose raylet may start workers)."""
    import psutil

    started = set()
    for child in _children() - children_before:
        started.add(child)
        with contextlib.suppress(psutil.NoSuchProcess):
            started.update(child.children(recursive=True))
    return started


def _holding(session: str) -> set:
    """Ray's processes that write into our session folder, wherever they now hang: an agent
    the raylet started after `_started_since` looked (a SIGINT while Ray starts) is orphaned
    when the raylet stops, no longer anyone's child, yet its stdout is still the session's
    raylet.out (seen: a DashboardAgent and a RuntimeEnvAgent left running, 2026-12-06)."""
    import psutil

    found = set()
    for process in psutil.process_iter(["name", "uids"]):
        if not (process.info["name"] or "").startswith("ray::") or process.info["uids"] is None \
                or process.info["uids"].real != os.getuid():
            continue
        with contextlib.suppress(psutil.Error):
            if any(f.path.startswith(session + os.sep) for f in process.open_files()):
                found.add(process)
    return found


def _end(processes: set) -> None:
    """Wait for `processes` to end; SIGTERM, then SIGKILL, the ones that do not."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=EXIT_WAIT_S)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(alive, timeout=EXIT_WAIT_S)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=EXIT_WAIT_S)


def _init(num_cpus: int | None, session: str, options: dict) -> None:
    import ray

    for attempt in range(STARTS):
        try:
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
                     _node_ip_address=LOOPBACK, _temp_dir=session, **options)
            return
        except Exception as e:
            if "timed out during startup" not in str(e) or attempt == STARTS - 1:
                raise
            ray.shutdown()


@dataclass
class Node:
    """The processes ray.init started for our node (GCS, raylet, monitor, dashboard, log
    monitor). A SIGTERM to the whole process group, as systemd's control-group stop sends it,
    ends them beside us; then nothing may ask the cluster anything more (Serve's delete waits
    on the GCS, whose client gives up after 60 s by ending the process, exit 1): `alive()`
    says whether the stop may still go through Serve."""

    daemons: set = field(default_factory=set)

    def alive(self, grace_s: float = 0.0) -> bool:
        """All of them still run, `grace_s` after asking: the signal that stops us reached
        them at the same moment, and a GCS takes a little while to end."""
        import psutil

        gone, running = psutil.wait_procs(self.daemons, timeout=grace_s) if grace_s else ((), self.daemons)
        try:
            return not gone and all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in running)
        except psutil.NoSuchProcess:
            return False


@contextlib.contextmanager
def own_ray(num_cpus: int | None = None, environment: dict[str, str] | None = None, **options):
    """A Ray node of this process (yields its Node), on loopback, stopped with every process
    it started on exit.

    `address="local"` with a session folder of its own: `ray.init()` with no address joins
    whatever Ray it finds on the machine (RAY_ADDRESS, the `ray_current_cluster` note of a
    `ray start`, or a running GCS), another test's or the user's, and then refuses `num_cpus`.
    `environment`: variables the node's processes start with (its raylet, and so every worker
    it forks, keeps the environment it started with), each one this process's environment
    does not set; this process's environment is as it was once the node is up.
    `options`: more of ray.init's (log_to_driver, resources, runtime_env, ...)."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", PROXY_READY_S)
    _no_implicit_init()
    # short, under /tmp: Ray's unix sockets live in it (a socket path has ~107 bytes)
    session = tempfile.mkdtemp(prefix="rayp", dir="/tmp")
    before = _children()
    node = Node()
    try:
        with _loopback_only(), _inherited(environment or {}):
            _init(num_cpus, session, options)
        node.daemons = _children() - before
        if ray.util.get_node_ip_address() != LOOPBACK:  # a Ray that resolves its address otherwise
            raise RuntimeError(f"the local Ray took {ray.util.get_node_ip_address()}, not {LOOPBACK}")
        yield node
    finally:
        started = _started_since(before)  # while the raylet lives: its agents and workers too
        _stop(serve_too=node.alive())
        # again while any remain: a raylet stopped mid-start may start agents while _end waits on it
        stray = started | _holding(session)
        for _ in range(STRAY_ROUNDS):
            if not stray:
                break
            _end(stray)
            stray = _holding(session)
        shutil.rmtree(session, ignore_errors=True)


def _no_implicit_init() -> None:
    """Ray's API calls ray.init() themselves when Ray is not up (auto_init_hook, read from
    RAY_ENABLE_AUTO_CONNECT at import): a call from one of Serve's background threads after
    our node stopped (its long-poll client, when the GCS died first) started a second Ray,
    dashboard and all, bound to every interface. A process that starts its own node never
    wants that: off, for the rest of the process (a later own_ray does not need it)."""
    from ray._private import auto_init_hook

    os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"
    auto_init_hook.enable_auto_connect = False


def _stop(serve_too: bool) -> None:
    import ray

    if serve_too and ray.is_initialized():
        from ray import serve

        with contextlib.suppress(Exception):
            serve.shutdown()
    ray.shutdown()


def keep_replica_grpc_home() -> None:
    """Called in a Serve replica's process before Serve starts its inter-deployment gRPC
    server: on a loopback node, that server listens on 127.0.0.1 too. Ray Serve 2.60 binds it
    to "[::]:0" with no setting (serve/_private/replica.py, Replica._on_initialized, after the
    deployment's __init__ ran) through the module's `add_port_to_grpc_server`, and tells the
    router the node's address and that port; so that one name is wrapped, in this process
    only, to bind the node's address instead. A Ray without that name is left as it is
    (tests/serving/test_ray_home.py would see the socket)."""
    import ray

    if ray.util.get_node_ip_address() != LOOPBACK:  # a cluster's replica: reached from other nodes
        return
    from ray.serve._private import replica

    bind = getattr(replica, "add_port_to_grpc_server", None)
    if bind is None or getattr(bind, "loopback", False):
        return

    def bind_loopback(server, address: str):
        return bind(server, LOOPBACK + address[len("[::]"):] if address.startswith("[::]:") else address)

    bind_loopback.loopback = True
    replica.add_port_to_grpc_server = bind_loopback
