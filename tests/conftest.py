"""Shared fixtures: a scratch project folder with the real recipes, the CLI as a real
subprocess (`python -m pipeline`), the way users and CI run it, and the real builds that
several test modules read, made once per test session (shared_build)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = ["tests.parallel"]  # under pytest -n, `timing` tests are skipped, saying why

# Small but real protocol settings so end-to-end tests stay quick on 2 cores; one intra-op
# thread per runtime, so that `make test`'s pytest-xdist workers do not oversubscribe the cores.
FAST = (
    "--set", "validate.latency.warmup=5",
    "--set", "validate.latency.iterations=40",
    "--set", "validate.latency.min_seconds=0",
    "--set", "validate.latency.block=10",
    "--set", "data.validation.samples=3",
    "--set", "validate.threads=1",
)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # As many workers as cores, or one more: each test's PyTorch (export, eager baseline,
    # the CLI subprocesses that inherit this environment) takes one thread, not every core.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def set_folder(recipe: str, *args: str) -> str:
    """engines/<this>/: where `pipeline run RECIPE ARGS` writes (its --set values name it)."""
    from pipeline.store.folder_names import overrides_digest

    values = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    return f"{recipe}@{overrides_digest(values)}" if values else recipe


# Where `run standard *FAST` writes (a run with --set never touches engines/standard/).
STANDARD = set_folder("standard", *FAST)
# The optimize stage's own latency comparison, kept short like FAST (whose one thread matters
# here too: on a shared 2-core machine two PyTorch threads ran MiniLM 5x slower, 485 vs 100 ms).
FAST_OPT = FAST + (
    "--set", "optimize.latency={warmup: 5, iterations: 20, min_seconds: 0, block: 10}",
)


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def folder(self) -> str:
        """The `engines: DIR` line `pipeline run` printed (relative to the project)."""
        lines = [line for line in self.err.splitlines() if line.startswith("engines: ")]
        assert lines, f"no `engines:` line in the output:\n{self.err}"
        return lines[-1].removeprefix("engines: ").strip()

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("Error:")]


def load_factor() -> float:
    """How much busier than one runnable process per core the machine is now (>= 1): the
    1-minute load average over the cores this process may use."""
    cores = len(os.sched_getaffinity(0)) or 1
    return max(1.0, os.getloadavg()[0] / cores)


def scaled(seconds: float) -> float:
    """A timeout for waiting on another process, stretched by the machine's load: a test
    waits for an event, and a busy machine (other xdist workers, other jobs) only delays it."""
    return seconds * load_factor()


def wait_exit(proc: subprocess.Popen, seconds: float) -> int:
    """proc.wait(), giving up only after `seconds` scaled by the load as it is while waiting
    (re-read every second, so a load that rises during the wait stretches it)."""
    start = time.monotonic()
    while True:
        try:
            return proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            if time.monotonic() - start > scaled(seconds):
                raise


class Project:
    """A scratch working directory holding a copy of recipes/ and data/; engines go to ./engines."""

    def __init__(self, path: Path):
        self.path = path
        shutil.copytree(ROOT / "recipes", path / "recipes")
        # the shipped data the recipes read (not the LM's training text: only tools/ reads it)
        shutil.copytree(ROOT / "data", path / "data", ignore=shutil.ignore_patterns("train.txt"))
        self.engines = path / "engines"
        self.built: Path | None = None  # the folder built() wrote into (a --set run's own)

    def run(self, *args: str, timeout: float = 600, env: dict | None = None,
            python_flags: bool = False) -> Result:
        """`python -m pipeline ARGS`; with python_flags, ARGS start with interpreter flags
        up to the first non-flag (e.g. "-X", "importtime", "run", ...)."""
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
        full_env.pop("PIPELINE_ENGINES", None)
        flags: list[str] = []
        if python_flags:
            flags, args = list(args[:2]), args[2:]
        proc = subprocess.run(
            [sys.executable, *flags, "-m", "pipeline", *args], cwd=self.path, env=full_env,
            capture_output=True, text=True, timeout=scaled(timeout),
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def folder(self, result: Result) -> Path:
        """The engines folder a `pipeline run` wrote into, as it printed it."""
        return self.path / result.folder

    def write(self, relative: str, text: str) -> Path:
        path = self.path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def snapshot(self) -> dict[str, str]:
        """sha256 of every file under engines/ (to prove a failed run changed nothing)."""
        if not self.engines.exists():
            return {}
        return {
            str(p.relative_to(self.engines)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(self.engines.rglob("*")) if p.is_file()
        }


@pytest.fixture
def project(tmp_path) -> Project:
    return Project(tmp_path)


def built(tmp_path_factory, folder: str, *args: str, env: dict | None = None,
          beside: Project | None = None) -> Project:
    """A fresh project in which `pipeline run ARGS` succeeded: what the shared build fixtures
    (one real run, read by many tests) stand on. BESIDE: a build whose engines/ the project
    starts with, so stages with the same key are copied from it (a variant of its recipe
    reuses its export), as they are in a user's engines/."""
    proj = Project(tmp_path_factory.mktemp(folder))
    if beside is not None:
        shutil.copytree(beside.engines, proj.engines)
    result = proj.run("run", *args, env=env)
    assert result.code == 0, result.err
    proj.built = proj.folder(result)
    return proj


def _session_root(tmp_path_factory) -> Path:
    """The folder every process of this test session can reach: $PIPELINE_TEST_BUILDS where
    set (`make test` gives both of its pytest runs one, so the timing part copies the builds
    the parallel part made); under pytest-xdist, the parent of the workers' own base folders
    (made new for each run, like theirs); alone, this process's base folder."""
    if os.environ.get("PIPELINE_TEST_BUILDS"):
        return Path(os.environ["PIPELINE_TEST_BUILDS"])
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_build(tmp_path_factory, key: str, *args: str, recipes: dict[str, str] | None = None,
                 env: dict | None = None) -> Project:
    """A project in which `pipeline run ARGS` succeeded, built once per test session however
    many pytest-xdist workers and test modules ask for it: the first caller builds it under
    an exclusive lock in the session's shared folder, later callers (and the other workers,
    which wait on the lock meanwhile) copy its engines/ into a project of their own, so a test
    that writes into its copy disturbs nobody. RECIPES (relative path -> text) are written
    into every project; KEY names the build, so one key must always mean the same ARGS."""
    root = _session_root(tmp_path_factory) / "shared-builds"
    root.mkdir(exist_ok=True)
    source = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also on failure
        done = source / "built-folder.txt"  # written last: a build that failed left none
        if not done.exists():
            shutil.rmtree(source, ignore_errors=True)
            proj = Project(source / "project")
            for relative, text in (recipes or {}).items():
                proj.write(relative, text)
            result = proj.run("run", *args, env=env)
            assert result.code == 0, result.err
            done.write_text(result.folder)
        folder = done.read_text()
    proj = Project(tmp_path_factory.mktemp(key))
    for relative, text in (recipes or {}).items():
        proj.write(relative, text)
    shutil.copytree(source / "project" / "engines", proj.engines)
    proj.built = proj.path / folder
    return proj


@pytest.fixture(scope="session")
def built_standard(tmp_path_factory) -> Project:
    """`pipeline run standard`, shared by the tests that only read its outputs (one build for
    the session; each xdist worker reads its own copy)."""
    return shared_build(tmp_path_factory, "standard", "standard", *FAST)


def digits_build(tmp_path_factory) -> Project:
    """`pipeline run digits` (a small MLP on scikit-learn's digits, INT8), one build for the
    session: stages/test_every_recipe.py checks it builds, loadgen/test_command.py loads it."""
    return shared_build(tmp_path_factory, "digits", "digits", *FAST_OPT)


@pytest.fixture(scope="session")
def built_digits(tmp_path_factory) -> Project:
    return digits_build(tmp_path_factory)


@pytest.fixture(scope="session")
def built_minilm(tmp_path_factory) -> Project:
    """One real `pipeline run minilm` (dynamo export of BERT: the slowest build here), shared
    by stages/test_optimize.py (its fusions, its embeddings against sentence-transformers) and
    stages/test_every_recipe.py, which may run on another xdist worker."""
    short = "{name: sequence, min: 2, opt: 16, max: 32}"  # the real model is slow on 2 cores
    return shared_build(tmp_path_factory, "minilm", "minilm", *FAST_OPT,
                        "--set", f"inputs.0.shape.1={short}", "--set", f"inputs.1.shape.1={short}")


@pytest.fixture(scope="session")
def built_flash(tmp_path_factory) -> Project:
    """`pipeline run flash` (the block-sparse tiny GLM), shared like built_minilm; the runs of
    recipes and --set variants on the flash model start beside a copy of it."""
    return shared_build(tmp_path_factory, "flash", "flash", *FAST_OPT)


@pytest.fixture(scope="session")
def built_gpt2(tmp_path_factory) -> Project:
    """`pipeline run gpt2-tiny`, shared like built_minilm."""
    return shared_build(tmp_path_factory, "gpt2", "gpt2-tiny", *FAST_OPT)


@pytest.fixture
def standard_copy(built_standard, tmp_path) -> Project:
    """A private copy of the built `standard` project, for tests that change its outputs
    (tampering, other --set or --target values) without disturbing the shared one."""
    proj = Project(tmp_path / "copy")
    shutil.copytree(built_standard.engines, proj.engines)
    return proj


def pytest_collection_modifyitems(config, items):
    """`tensorrt` and `gpu` tests are collected everywhere and skipped, with the reason,
    where the machine lacks what they need."""
    from pipeline.core import deps

    no_trt = pytest.mark.skip(reason="TensorRT is not installed (it needs an NVIDIA GPU and NVIDIA's index)")
    no_gpu = pytest.mark.skip(reason="no NVIDIA GPU on this machine (nvidia-smi found none)")
    for item in items:
        if "tensorrt" in item.keywords and not deps.has("tensorrt"):
            item.add_marker(no_trt)
        if "gpu" in item.keywords and not deps.gpus():
            item.add_marker(no_gpu)
