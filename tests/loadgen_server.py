"""A tiny stdlib HTTP server speaking the serving API of docs/serving.md, for the load
generator's tests and its overhead benchmark: it answers /ready, /infer (after `service`
seconds, echoing the batch fields) and /generate (streamed tokens), and can stall once,
reject every k-th request with 503, or hang on one request (a timeout).

It is a stand-in for a model server whose behaviour is known exactly, so that the tests
check the client's bookkeeping (stall charged from the scheduled time, timeouts and
rejections resolved) without timing luck; the real server (`pipeline serve`) has its own.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Behaviour:
    service: float = 0.0             # seconds per /infer request
    stall_at_request: int | None = None  # the request (0-based arrival order) that starts a stall
    stall_seconds: float = 0.0       # every answer waits until the stall is over
    reject_every: int | None = None  # 503 for every k-th request
    hang_request: int | None = None  # this request is answered only after `hang_seconds`
    hang_seconds: float = 0.0
    tokens: int = 4                  # /generate: tokens streamed
    token_gap: float = 0.002
    arrivals: list[float] = field(default_factory=list)  # perf_counter at each request
    stall_end: float | None = None
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(b: Behaviour):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the client reuses connections
        disable_nagle_algorithm = True  # each streamed token leaves at once, as uvicorn sends it

        def log_message(self, *args):  # quiet
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.endswith("/ready"):
                self._send(200, {"ready": True})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            json.loads(self.rfile.read(length) or b"{}")
            with b.lock:
                index = len(b.arrivals)
                b.arrivals.append(time.perf_counter())
                if index == b.stall_at_request:
                    b.stall_end = b.arrivals[-1] + b.stall_seconds
                b.in_flight += 1
                b.max_in_flight = max(b.max_in_flight, b.in_flight)
            try:
                self._answer(index)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up on it (a timeout): its business, not an error here
            finally:
                with b.lock:
                    b.in_flight -= 1

        def _answer(self, index: int) -> None:
            t0 = time.perf_counter()
            if b.reject_every and index % b.reject_every == b.reject_every - 1:
                self._send(503, {"error": "queue full"})
                return
            if index == b.hang_request:
                time.sleep(b.hang_seconds)
            time.sleep(b.service)
            if b.stall_end is not None and time.perf_counter() < b.stall_end:
                time.sleep(b.stall_end - time.perf_counter())
            if self.path.endswith("/generate"):
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i in range(b.tokens):
                    self._chunk({"token": i})
                    time.sleep(b.token_gap)
                self._chunk({"done": True, "tokens": b.tokens, "queue_ms": 0.0, "ttft_ms": 0.0})
                self.wfile.write(b"0\r\n\r\n")
                return
            self._send(200, {"outputs": {"y": [0.0]}, "queue_ms": 0.0,
                             "compute_ms": (time.perf_counter() - t0) * 1e3, "batch_size": 1})

        def _chunk(self, message: dict) -> None:
            data = json.dumps(message).encode() + b"\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # a stall piles up connections: never refuse one for backlog
    daemon_threads = True


class FakeServer:
    """Context manager: the server on a free port in a thread; `.url` is a model's base URL."""

    def __init__(self, behaviour: Behaviour | None = None, model: str = "m"):
        self.behaviour = behaviour or Behaviour()
        self.httpd = _Server(("127.0.0.1", 0), _handler(self.behaviour))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/models/{model}"

    def __enter__(self) -> FakeServer:
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":  # `python -m tests.loadgen_server PORT`: a standalone echo server
    import sys

    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8765
    httpd = _Server(("127.0.0.1", port), _handler(Behaviour()))
    print(f"http://127.0.0.1:{port}/v1/models/m", flush=True)
    httpd.serve_forever()
