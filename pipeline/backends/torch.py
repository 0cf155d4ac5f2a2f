"""PyTorch runners: the eager baseline every engine is validated against, and the same
eager model captured as CUDA Graphs (the honest GPU baseline: launch overhead removed).

Both take numpy feeds by input name (forward() order) and return numpy outputs by the
recipe's output names, so they time the same work an engine runner does (host in, host out).
"""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np
from polygraphy.backend.base import BaseRunner

DTYPES = ("fp32", "fp16", "bf16")


def torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def to_numpy(outputs, names: list[str]) -> OrderedDict:
    """Model outputs (tensor, tuple or dict) -> {name: float32/int numpy array on the host}."""
    import torch

    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    elif isinstance(outputs, dict):
        outputs = tuple(outputs.values())
    if len(outputs) != len(names):
        raise ValueError(f"the model returned {len(outputs)} outputs; the recipe names {len(names)}: {names}")
    return OrderedDict(
        (n, t.detach().float().cpu().numpy() if t.is_floating_point() else t.detach().cpu().numpy())
        for n, t in zip(names, outputs)
    )


class TorchRunner(BaseRunner):
    """Eager PyTorch behind Polygraphy's runner interface (its PytRunner assumes CUDA)."""

    def __init__(self, model, input_names: list[str], output_names: list[str],
                 threads: int | None = None, device: str = "cpu", dtype: str = "fp32",
                 name: str | None = None):
        super().__init__(name=name or f"torch-eager-{dtype}", prefix="torch-runner")
        self.model, self.input_names, self.output_names = model, input_names, output_names
        self.threads, self.device, self.dtype = threads, device, dtype

    def activate_impl(self):
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
        self._torch = torch
        self._float = torch_dtype(self.dtype)
        self.model = self.model.to(device=self.device, dtype=self._float)

    def get_input_metadata_impl(self):
        from polygraphy.common import TensorMetadata

        return TensorMetadata()  # shapes are dynamic; the model checks its own inputs

    def _inputs(self, feed_dict):
        torch = self._torch
        out = []
        for name in self.input_names:
            t = torch.from_numpy(np.ascontiguousarray(feed_dict[name])).to(self.device, non_blocking=True)
            out.append(t.to(self._float) if t.is_floating_point() else t)
        return out

    def infer_impl(self, feed_dict):
        start = time.perf_counter()
        with self._torch.inference_mode():
            out = to_numpy(self.model(*self._inputs(feed_dict)), self.output_names)  # syncs
        self.inference_time = time.perf_counter() - start
        return out

    def deactivate_impl(self):
        del self._torch


class CudaGraphRunner(TorchRunner):
    """The eager model captured as a CUDA Graph, one graph per input shape, then replayed.

    Capture: a few warm runs on a side stream (allocations settle), then one run recorded
    into a graph that reads static input buffers; a request copies its feed into those
    buffers and replays. A new input shape gets its own capture.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("device", "cuda")
        super().__init__(*args, **kwargs)
        self.name = kwargs.get("name") or f"torch-cudagraph-{self.dtype}"
        self.graphs: dict[tuple, tuple] = {}  # shapes -> (graph, static inputs, static outputs)

    def _capture(self, inputs):
        torch = self._torch
        static = [t.clone() for t in inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(3):
                self.model(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.inference_mode():
            outputs = self.model(*static)
        return graph, static, outputs

    def infer_impl(self, feed_dict):
        start = time.perf_counter()
        inputs = self._inputs(feed_dict)
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        if key not in self.graphs:
            self.graphs[key] = self._capture(inputs)
        graph, static, outputs = self.graphs[key]
        for dst, src in zip(static, inputs):
            dst.copy_(src, non_blocking=True)
        graph.replay()
        out = to_numpy(outputs, self.output_names)  # device -> host copy synchronizes
        self.inference_time = time.perf_counter() - start
        return out

    def deactivate_impl(self):
        self.graphs.clear()
        super().deactivate_impl()
