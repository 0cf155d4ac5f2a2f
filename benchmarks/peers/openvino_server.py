"""A small OpenAI-compatible streaming server around OpenVINO GenAI's ContinuousBatchingPipeline.

OURS, written for benchmarks/chat_peers.py: OpenVINO GenAI ships no HTTP server on PyPI
(OpenVINO Model Server is a separate product), so this wrapper lets the same client
(`pipeline load --api chat`) drive it over HTTP like the other servers. It implements only
what that client sends: POST /v1/chat/completions (messages through the model's chat template,
stream with stream_options.include_usage, max_tokens, temperature 0 = greedy, vLLM's
ignore_eos), GET /v1/models, GET /health. Anything else is a 400/404.

One engine thread owns the pipeline: it adds the requests queued by the HTTP threads, calls
step() while any request runs, and hands each request its new token ids; the HTTP thread
detokenizes and streams them. Runs in the OpenVINO venv (benchmarks/peers/setup.sh), not in
the project's: python openvino_server.py --model DIR --port 8104 --threads 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import queue
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openvino_genai as ov_genai


class Engine:
    """The pipeline and the one thread that steps it."""

    def __init__(self, model_dir: str, threads: int, max_seqs: int, cache_gb: int, prefix_caching: bool = True):
        scheduler = ov_genai.SchedulerConfig()
        scheduler.cache_size = cache_gb  # GB of KV cache
        scheduler.max_num_seqs = max_seqs
        scheduler.dynamic_split_fuse = True
        # off in OpenVINO GenAI 2026.4 by default; on here, as `pipeline serve`'s prefix cache is:
        # a conversation's next turn then prefills only its new tokens on both servers
        scheduler.enable_prefix_caching = prefix_caching
        props = {"INFERENCE_NUM_THREADS": threads}
        self.pipe = ov_genai.ContinuousBatchingPipeline(model_dir, scheduler, "CPU", props)
        self.tokenizer = self.pipe.get_tokenizer()
        self.eos = self.tokenizer.get_eos_token_id()
        self.pending: list[tuple[str, object, object, queue.Queue]] = []
        self.running: dict[str, tuple[object, queue.Queue]] = {}
        self.wake = threading.Condition()
        self.ids = itertools.count()
        threading.Thread(target=self._loop, daemon=True, name="engine").start()

    def submit(self, messages: list[dict], max_tokens: int, ignore_eos: bool):
        """(prompt token count, queue of ("tokens", [ids]) / ("done", reason) events)."""
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = self.tokenizer.encode(prompt, add_special_tokens=False).input_ids  # ov.Tensor [1, T]
        config = ov_genai.GenerationConfig()
        config.max_new_tokens = max_tokens
        config.do_sample = False  # greedy, as temperature 0 asks
        config.eos_token_id = self.eos
        config.ignore_eos = ignore_eos
        events: queue.Queue = queue.Queue()
        with self.wake:
            self.pending.append((str(next(self.ids)), ids, config, events))
            self.wake.notify()
        return int(ids.get_shape()[1]), events

    def _loop(self) -> None:
        while True:
            with self.wake:
                while not self.pending and not self.running:
                    self.wake.wait()
                pending, self.pending = self.pending, []
            for request_id, ids, config, events in pending:
                handle = self.pipe.add_request(int(request_id), ids, config)
                self.running[request_id] = (handle, events)
            self.pipe.step()
            self._hand_out()

    def _hand_out(self) -> None:
        for request_id, (handle, events) in list(self.running.items()):
            if handle.can_read():
                for output in handle.read().values():  # one sequence (greedy): its new ids
                    if output.generated_ids:
                        events.put(("tokens", list(output.generated_ids)))
            status = handle.get_status()
            if status != ov_genai.GenerationStatus.RUNNING:
                finished = status == ov_genai.GenerationStatus.FINISHED
                events.put(("done", "finished" if finished else str(status)))
                del self.running[request_id]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: Engine
    model_name: str

    def log_message(self, *args) -> None:  # quiet: the benchmark reads the client's figures
        pass

    def do_GET(self) -> None:
        if self.path in ("/health", "/v1/health"):
            return self._json(200, {"status": "ok"})
        if self.path == "/v1/models":
            return self._json(200, {"object": "list", "data": [
                {"id": self.model_name, "object": "model", "created": 0, "owned_by": "openvino"}]})
        self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        if self.path != "/v1/chat/completions":
            return self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            messages = body["messages"]
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 256)
            if float(body.get("temperature", 1.0)) != 0.0:
                raise ValueError("only temperature 0 (greedy) is served")
        except (ValueError, KeyError, TypeError) as e:
            return self._json(400, {"error": {"message": str(e), "type": "invalid_request_error"}})
        prompt_tokens, events = self.engine.submit(messages, max_tokens, bool(body.get("ignore_eos")))
        if body.get("stream"):
            self._stream(events, prompt_tokens, max_tokens, bool((body.get("stream_options") or {}).get("include_usage")))
        else:
            ids, reason = self._collect(events)
            text = self.engine.tokenizer.decode(ids, skip_special_tokens=True)
            self._json(200, {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                             "created": int(time.time()), "model": self.model_name,
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                          "finish_reason": self._finish(ids, reason, max_tokens)}],
                             "usage": self._usage(prompt_tokens, ids)})

    def _stream(self, events: queue.Queue, prompt_tokens: int, max_tokens: int, usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def send(choices: list, usage_obj=None) -> None:
            data = {"id": chunk_id, "object": "chat.completion.chunk", "created": created,
                    "model": self.model_name, "choices": choices, "usage": usage_obj}
            self._chunk(f"data: {json.dumps(data)}\n\n".encode())

        send([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        ids: list[int] = []
        sent = ""
        while True:
            kind, value = events.get()
            if kind == "done":
                break
            ids.extend(value)
            text = self.engine.tokenizer.decode(ids, skip_special_tokens=True)
            if text.endswith("\ufffd"):  # a character whose bytes are not all generated yet
                continue
            if len(text) > len(sent):
                send([{"index": 0, "delta": {"content": text[len(sent):]}, "finish_reason": None}])
                sent = text
        send([{"index": 0, "delta": {}, "finish_reason": self._finish(ids, value, max_tokens)}])
        if usage:
            send([], self._usage(prompt_tokens, ids))
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _collect(self, events: queue.Queue) -> tuple[list[int], str]:
        ids: list[int] = []
        while True:
            kind, value = events.get()
            if kind == "done":
                return ids, value
            ids.extend(value)

    def _finish(self, ids: list[int], reason: str, max_tokens: int) -> str:
        return "length" if len(ids) >= max_tokens else "stop"

    def _usage(self, prompt_tokens: int, ids: list[int]) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids),
                "total_tokens": prompt_tokens + len(ids)}

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an optimum-cli OpenVINO export folder")
    parser.add_argument("--port", type=int, default=8104)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--name", default="smollm2", help="the model's name in the API")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-seqs", type=int, default=16)
    parser.add_argument("--cache-gb", type=int, default=2)
    parser.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="SchedulerConfig.enable_prefix_caching (OpenVINO's default: off)")
    args = parser.parse_args()
    Handler.engine = Engine(args.model, args.threads, args.max_seqs, args.cache_gb, args.prefix_caching)
    Handler.model_name = args.name
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"openvino_server: http://{args.host}:{args.port}/v1 serving {args.name}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
