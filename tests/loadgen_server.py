"""A tiny stdlib HTTP server speaking the standard protocols `pipeline load` speaks, for the
load generator's tests: KServe v2 (GET /v2, /v2/health/ready, /v2/models/<m>; POST
/v2/models/<m>/infer, JSON tensors, answered after `service` seconds with this project's
timings in `parameters`) and the OpenAI API (GET /v1/models; POST /v1/completions and
/v1/chat/completions streamed as server-sent events, `tokens` chunks `token_gap` apart, then
the usage and [DONE]). It can stall once, reject every k-th request with 503, hang on one
request (a timeout), or send figures no server should (`figures`: raw JSON text spliced into
the answer's `parameters` or `usage`, e.g. NaN).

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
    tokens: int = 4                  # OpenAI streams: text chunks streamed (one token each)
    token_gap: float = 0.002
    figures: str | None = None       # raw JSON members for `parameters` / `usage`, e.g. '"queue_ms": NaN'
    bodies: list[bytes] = field(default_factory=list)  # every POST body, in arrival order
    arrivals: list[float] = field(default_factory=list)  # perf_counter at each request
    stall_end: float | None = None
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(b: Behaviour, model: str):
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
            routes = {"/v2/health/ready": {"ready": True},
                      "/v2": {"name": "stand-in", "version": "0", "extensions": []},
                      f"/v2/models/{model}": {"name": model, "versions": ["1"]},
                      "/v1/models": {"object": "list", "data": [{"id": model, "object": "model"}]}}
            if self.path in routes:
                self._send(200, routes[self.path])
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            body = self.rfile.read(length)
            json.loads(body or b"{}")
            with b.lock:
                index = len(b.arrivals)
                b.arrivals.append(time.perf_counter())
                b.bodies.append(body)
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
            if self.path in ("/v1/completions", "/v1/chat/completions"):
                self._stream(self.path.endswith("chat/completions"))
                return
            if self.path != f"/v2/models/{model}/infer":
                self._send(404, {"error": "not found"})
                return
            timings = (b.figures or f'"queue_ms": 0.0, "compute_ms": '
                       f'{(time.perf_counter() - t0) * 1e3}, "batch_size": 1')
            head = json.dumps({"model_name": model, "outputs": [
                {"name": "y", "datatype": "FP32", "shape": [1], "data": [0.0]}]})
            data = (head[:-1] + ', "parameters": {' + timings + "}}").encode()  # raw: NaN as sent
            self._send_raw(200, data)

        def _stream(self, chat: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(b.tokens):
                choice = {"index": 0, "delta": {"content": f"t{i}"}} if chat else \
                    {"index": 0, "text": f"t{i}"}
                self._chunk("data: " + json.dumps({"choices": [choice], "usage": None}) + "\n\n")
                time.sleep(b.token_gap)
            usage = b.figures or f'"prompt_tokens": 3, "completion_tokens": {b.tokens}'
            self._chunk('data: {"choices": [], "usage": {' + usage + "}}\n\n")
            self._chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")

        def _send_raw(self, code: int, data: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _chunk(self, text: str) -> None:
            data = text.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # a stall piles up connections: never refuse one for backlog
    daemon_threads = True


class FakeServer:
    """Context manager: the server on a free port in a thread, serving `model`."""

    def __init__(self, behaviour: Behaviour | None = None, model: str = "m"):
        self.behaviour = behaviour or Behaviour()
        self.httpd = _Server(("127.0.0.1", 0), _handler(self.behaviour, model))
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.url = self.base  # what `pipeline load --url` takes

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
    httpd = _Server(("127.0.0.1", port), _handler(Behaviour(), "m"))
    print(f"http://127.0.0.1:{port}", flush=True)
    httpd.serve_forever()
