"""issue 39's load-generator items: bounded arguments (3), and a server that cannot be
trusted (13): raw bytes instead of HTTP, figures no server should send (NaN, Infinity,
-1e308), a run in which every request failed. Each is one line and a non-zero exit."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from pipeline.loadgen import client, summary
from pipeline.loadgen.protocol import Target, kserve_payload, openai_payload
from tests.loadgen_server import Behaviour, FakeServer

URL = ("--url", "http://127.0.0.1:9")


@pytest.mark.parametrize("flag,value", [("--rate", "nan"), ("--rate", "inf"), ("--rate", "1e9"),
                                        ("--duration", "1e12"), ("--duration", "nan"),
                                        ("--min-requests", "1000000000000"), ("--sweep", "5,nan"),
                                        ("--warmup", "inf"), ("--timeout", "-inf")])
def test_unbounded_arguments_are_one_line_and_exit_2(project, flag, value):
    mode = () if flag in ("--rate", "--sweep") else ("--rate", "1")
    result = project.run("load", "digits", *URL, *mode, f"{flag}={value}")
    assert result.code == 2, result.err
    assert "Traceback" not in result.err and flag in result.err


def test_a_server_answering_raw_bytes_is_one_line(project):
    """Not HTTP on the port: one line naming the URL, no http.client traceback."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def garbage():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"\x00\x17garbage, not HTTP\r\n\r\n")

    threading.Thread(target=garbage, daemon=True).start()
    try:
        result = project.run("load", "digits", "--url", f"http://127.0.0.1:{listener.getsockname()[1]}",
                             "--rate", "5", "--duration", "1", timeout=120)
    finally:
        listener.close()
    assert result.code == 2, result.err
    assert "Traceback" not in result.err and "not in HTTP" in result.err
    assert len(result.error_lines) == 1


@pytest.mark.parametrize("figures", ['"queue_ms": NaN', '"compute_ms": Infinity',
                                     '"queue_ms": -1e308', '"batch_size": 0'])
def test_figures_no_server_should_send_fail_their_request(figures):
    with FakeServer(Behaviour(figures=figures)) as server:
        target = Target(server.base, "m")
        body = kserve_payload({"x": np.zeros((1, 2))}, {"x": "float32"}, binary=False)
        outs = client.run_open(target, [0.01, 0.02, 0.03], [body], timeout=5.0)
    assert [o.status for o in outs] == ["error"] * 3
    assert all("the server sent" in o.error for o in outs), outs[0].error
    point = summary.summarize(outs, warmup=0.0, window=1.0, offered_rate=3.0)
    assert point.queue_ms is None and point.compute_ms is None and point.batch_sizes == {}


def test_a_stream_whose_usage_is_not_a_count_fails():
    with FakeServer(Behaviour(figures='"completion_tokens": Infinity')) as server:
        target = Target(server.base, "m", "completions")
        outs = client.run_open(target, [0.01], [openai_payload(target, [1, 2], 4)], timeout=5.0)
    assert outs[0].status == "error" and "Infinity" in outs[0].error


def test_a_run_in_which_every_request_failed_exits_4_and_writes_nothing(project):
    with FakeServer(Behaviour(figures='"queue_ms": NaN'), model="digits") as server:
        result = project.run("load", "digits", "--url", server.url, "--rate", "20", "--duration",
                             "0.5", "--warmup", "0", "--min-requests", "5", timeout=120)
    assert result.code == 4, result.err
    assert "every one of the" in result.err and "NaN" in result.err
    assert not list((project.engines / "digits").glob("load-*"))  # nothing written
