"""`pipeline load --serve`: start `pipeline serve RECIPE` in a subprocess of its own (its own
process group), wait until it answers the standard readiness route (KServe's
/v2/health/ready, the OpenAI API's /v1/models), and stop it when the load test ends; and
the GETs the load generator makes of any server, one line when what answers is not HTTP.

The server and the load generator are separate processes: a client that shared the
server's interpreter would take its CPU and its GIL, and measure itself.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from pipeline.core.errors import InputError, StageFailed
from pipeline.core.json_object import JsonObject
from pipeline.loadgen import replies

MAX_BODY = 1 << 20  # a readiness or stats answer is small: read no more of one
SERVING_LINE = "Ctrl-C or SIGTERM stops it"  # what `pipeline serve` prints once it serves for good


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stats(base: str, model: str) -> JsonObject | None:
    """GET {base}/v1/models/<model>/stats: `pipeline serve`'s own view (load time, memory,
    batch sizes, its replica's pid), or None (another server has no such route)."""
    return get_json(f"{base}/v1/models/{model}/stats", 10.0)


def get_json(url: str, timeout: float = 2.0) -> JsonObject | None:
    """GET url: its JSON object ({} when not one) when it answers 200, None when it does not
    answer or answers another status. InputError when what answers does not speak HTTP
    (a raw-bytes service on that port: one line, not http.client's traceback)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            if resp.status != 200:
                return None
            body = resp.read(MAX_BODY)
    except http.client.HTTPException as e:
        raise InputError(f"{url} answered, but not in HTTP ({type(e).__name__}: "
                         f"{str(e)[:80]!r})", "check the URL's host and port") from None
    except (urllib.error.URLError, OSError, ValueError):
        return None
    try:
        data = replies.strict_json(body or b"{}")
    except replies.BadReply:
        data = {}
    return data if isinstance(data, dict) else {}


def ready_route(base: str, api: str) -> str:
    """The standard readiness route: KServe's /v2/health/ready, the OpenAI API's /v1/models
    (vLLM, llama.cpp's server and `pipeline serve` all list their models there)."""
    return f"{base}/v2/health/ready" if api == "kserve" else f"{base}/v1/models"


def _tail(log: Path | None) -> str:
    """The server's last `Error:` line (or last line), for a message."""
    if log is None or not log.is_file():
        return ""
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("Error:")]
    return (errors or lines or [""])[-1].strip()


def wait_ready(url: str, deadline_s: float, proc: subprocess.Popen | None = None,
               log: Path | None = None) -> JsonObject:
    """Polls GET url (a readiness route) until it answers 200: its JSON."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise StageFailed(f"`pipeline serve` exited with code {proc.returncode} before it was "
                              f"ready: {_tail(log)[:300]}", f"its whole output: {log}")
        info = get_json(url)
        if info is not None:
            return info
        time.sleep(0.5)
    raise InputError(f"{url} did not answer 200 within {deadline_s:g} s",
                     "check the URL, or that the server has finished starting")


class ServeProcess:
    """Context manager: `pipeline serve` on a free port; (url, pid) while it runs."""

    def __init__(self, recipe_ref: str, api: str, overrides: tuple[str, ...], engines_dir: Path,
                 engine: str | None, log: Path, start_timeout: float = 900.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"  # the server's base URL
        self.api = api
        self.cmd = [sys.executable, "-m", "pipeline", "serve", recipe_ref, "--port", str(self.port),
                    "--engines-dir", str(engines_dir)]
        self.cmd += [a for o in overrides for a in ("--set", o)]
        if engine:
            self.cmd += ["--engine", engine]
        self.log, self.start_timeout = log, start_timeout
        self.proc: subprocess.Popen | None = None
        self.ready_info: dict = {}
        self.started_s = 0.0

    def __enter__(self) -> ServeProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "wb")  # noqa: SIM115 - closed in __exit__
        self._out = out
        t0 = time.monotonic()
        # a local Ray of its own: ray.init() with no address joins the latest `ray start`
        # cluster on the machine (Ray's documented lookup), another user's, unless told "local"
        env = {**os.environ, "RAY_ADDRESS": os.environ.get("RAY_ADDRESS", "local")}
        self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)
        try:
            self.ready_info = wait_ready(ready_route(self.url, self.api), self.start_timeout,
                                         self.proc, self.log)
            self._settle()
        except BaseException:
            self.__exit__()
            raise
        self.started_s = time.monotonic() - t0
        return self

    def _settle(self, most_s: float = 180.0) -> None:
        """`pipeline serve` answers /ready before it has finished checking its first answer
        against the engine in process (which takes CPU): wait for the line it prints when it
        starts serving for good, at most `most_s` seconds (then go on: the warm-up absorbs it)."""
        end = time.monotonic() + most_s
        while time.monotonic() < end and self.proc.poll() is None:
            if SERVING_LINE in self.log.read_text(errors="replace"):
                return
            time.sleep(0.5)
        if self.proc.poll() is not None:
            raise StageFailed(f"`pipeline serve` exited with code {self.proc.returncode} after it "
                              f"was ready: {_tail(self.log)[:300]}", f"its whole output: {self.log}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def __exit__(self, *exc) -> None:
        """SIGINT first (serve shuts its Ray instance down), then SIGTERM, then SIGKILL, each
        to this server's own process group only."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            for sig, wait in ((signal.SIGINT, 60), (signal.SIGTERM, 15), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._out.close()
