"""PyTorch runners: the eager baseline every engine is validated against, and the same
eager model captured as CUDA Graphs (the honest GPU baseline: launch overhead removed).

Both take numpy feeds by input name (forward() order) and return numpy outputs by the
recipe's output names, so they time the same work an engine runner does (host in, host out).
With `host_outputs=False` they return the device tensors instead, after a synchronize: what
a GPU study times when copying [8, 512, 32000] fp32 logits (524 MB) to the host would cost
more than the model itself.
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


def by_name(outputs, names: list[str]) -> OrderedDict:
    """Model outputs (tensor, tuple or dict) -> {name: tensor}, in the recipe's order."""
    import torch

    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    elif isinstance(outputs, dict):
        outputs = tuple(outputs.values())
    if len(outputs) != len(names):
        raise ValueError(f"the model returned {len(outputs)} outputs; the recipe names {len(names)}: {names}")
    return OrderedDict(zip(names, (t.detach() for t in outputs)))


def to_host(tensors: OrderedDict) -> OrderedDict:
    """{name: tensor} -> {name: float32/int numpy array on the host} (a device copy syncs)."""
    return OrderedDict((n, t.float().cpu().numpy() if t.is_floating_point() else t.cpu().numpy())
                       for n, t in tensors.items())


def finish(outputs, names: list[str], host: bool) -> OrderedDict:
    """What a runner returns: host arrays, or the device tensors once the device is done."""
    tensors = by_name(outputs, names)
    if host:
        return to_host(tensors)
    first = next(iter(tensors.values()), None)
    if first is not None and first.is_cuda:
        import torch

        torch.cuda.synchronize(first.device)
    return tensors


class TorchRunner(BaseRunner):
    """Eager PyTorch behind Polygraphy's runner interface (its PytRunner assumes CUDA)."""

    def __init__(self, model, input_names: list[str], output_names: list[str],
                 threads: int | None = None, device: str = "cpu", dtype: str = "fp32",
                 name: str | None = None, host_outputs: bool = True):
        super().__init__(name=name or f"torch-eager-{dtype}", prefix="torch-runner")
        self.model, self.input_names, self.output_names = model, input_names, output_names
        self.threads, self.device, self.dtype = threads, device, dtype
        self.host_outputs = host_outputs

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
            out = finish(self.model(*self._inputs(feed_dict)), self.output_names, self.host_outputs)
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
        # Device tensors are the graph's static outputs: the next replay overwrites them.
        out = finish(outputs, self.output_names, self.host_outputs)
        self.inference_time = time.perf_counter() - start
        return out

    def deactivate_impl(self):
        self.graphs.clear()
        super().deactivate_impl()
