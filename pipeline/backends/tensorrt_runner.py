"""Running a TensorRT engine: a Polygraphy runner with CUDA Graphs, layer timing, inspection.

Device memory, streams and CUDA Graphs come from torch.cuda (the pipeline already depends on
torch; a CUDA build of it is needed on GPU machines). Per request:

    host feed -> device inputs (pinned to the engine's I/O addresses) -> enqueue | graph replay
    -> device outputs -> host numpy

On an input-shape change the runner picks the optimization profile tuned nearest the new
shapes (`choose_profile`) and switches the context to it only when that is another profile.
CUDA Graphs follow TensorRT's recipe: after an input-shape change, one plain enqueue
(TensorRT flushes deferred shape work there), then capture one enqueue into a graph, then
replay it for every request with those shapes (captured thread-local, as trtexec does). A
capture that fails (data-dependent shapes, loops, plugins that sync) leaves the runner on
plain enqueue with the reason in `details`.
Nothing touches the GPU before the runner is activated.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import OrderedDict

import numpy as np
from polygraphy.backend.base import BaseRunner

from pipeline.core.errors import StageFailed

LayerTimes = dict[str, float]  # engine layer -> its median ms


def _torch_dtype(trt, torch, dtype):
    table = {
        trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16,
        trt.DataType.BF16: torch.bfloat16, trt.DataType.INT8: torch.int8,
        trt.DataType.INT32: torch.int32, trt.DataType.INT64: torch.int64,
        trt.DataType.BOOL: torch.bool, trt.DataType.UINT8: torch.uint8,
    }
    if dtype not in table:
        raise StageFailed(f"engine I/O tensor of type {dtype} cannot be fed from numpy",
                          "keep graph inputs and outputs in fp32/fp16/int types")
    return table[dtype]


# What trtexec captures with (cudaStreamCaptureModeThreadLocal): only this thread's unsafe
# calls (cudaMalloc, a sync) during the capture break it. "global", torch's default, breaks it
# for such calls from any thread of the process too (a resource monitor, a data loader).
CAPTURE_MODE = "thread_local"


def _log_ratio(a: int, b: int) -> float:
    return abs(math.log(max(a, 1) / max(b, 1)))


def choose_profile(engine, shapes: dict[str, tuple]) -> int:
    """The optimization profile that fits `shapes` best.

    Among the profiles whose [min, max] holds every input shape: the one whose opt shape is
    nearest (sum over all dims of |log(size / opt)|: 2 against opt 1 is as far as 64 against
    32), then the narrowest range, then the lowest index. TensorRT times and picks each
    profile's tactics at its opt shape (and only among kernels valid over its whole range),
    so the profile tuned nearest to the request runs kernels chosen for it. Not the first that
    fits: profile 0 always spans the inputs' full range (`tensorrt.profiles`), so the first fit
    would always be 0 and a recipe's extra `profiles:` would never run.

    engine: anything with TensorRT's ICudaEngine query API (`num_optimization_profiles`,
    `get_tensor_profile_shape(name, index) -> [min, opt, max]`).
    """
    best = None
    for index in range(engine.num_optimization_profiles):
        distance = width = 0.0
        for n, shape in shapes.items():
            lo, opt, hi = (tuple(d) for d in engine.get_tensor_profile_shape(n, index))
            if len(lo) != len(shape) or not all(a <= s <= b for a, s, b in zip(lo, shape, hi)):
                break
            distance += sum(_log_ratio(s, o) for s, o in zip(shape, opt))
            width += sum(_log_ratio(b, a) for a, b in zip(lo, hi))
        else:
            key = (round(distance, 9), round(width, 9), index)  # rounded: equal sums tie
            best = key if best is None or key < best else best
    if best is None:
        raise StageFailed(f"input shapes {shapes} are outside every optimization profile of the engine",
                          "add a profile to the target's `profiles:` or widen the input dims")
    return best[2]


def switch_profile(context, index: int, stream_handle: int) -> bool:
    """Make `index` the context's optimization profile; True when that was a switch.

    Only on a change: each set_optimization_profile_async makes TensorRT schedule resource
    updates (and warn about them) on the next enqueue, even when the index is the same."""
    if context.active_optimization_profile == index:
        return False
    try:  # the Python bindings raise where the C++ API returns false
        context.set_optimization_profile_async(index, stream_handle)
    except RuntimeError as e:
        raise StageFailed(f"TensorRT could not select optimization profile {index}: {e}") from e
    return True


def set_address(context, name: str, address: int) -> None:
    """context.set_tensor_address, refusing what TensorRT refuses (it returns False, no raise)."""
    if not context.set_tensor_address(name, address):
        raise StageFailed(f"TensorRT refused the device address of tensor `{name}` "
                          "(set_tensor_address returned False)",
                          "see the TensorRT log above: an unknown tensor name or a misaligned address")


class TensorRTRunner(BaseRunner):
    """engine: a path to a serialized plan, or an already deserialized trt.ICudaEngine."""

    def __init__(self, engine, cuda_graphs: bool = True, name: str = "tensorrt"):
        super().__init__(name=name, prefix="trt-runner")
        self.engine_source, self.cuda_graphs = engine, cuda_graphs
        self.details = {"cuda_graphs": "on" if cuda_graphs else "off (disabled by the recipe)",
                        "captures": 0, "replays": 0, "enqueues": 0, "capture_failure": None,
                        "profile_switches": 0}

    # ---------------------------------------------------------------- lifecycle
    def activate_impl(self):
        import tensorrt as trt
        import torch

        if not torch.cuda.is_available():
            raise StageFailed("the TensorRT runner needs torch with CUDA; torch.cuda is unavailable",
                              "install a CUDA build of torch on the GPU machine")
        self._trt, self._torch = trt, torch
        if isinstance(self.engine_source, trt.ICudaEngine):
            self.engine = self.engine_source
        else:
            from polygraphy.backend.common import BytesFromPath
            from polygraphy.backend.trt import EngineFromBytes

            self.engine = EngineFromBytes(BytesFromPath(str(self.engine_source)))()
        self.context = self.engine.create_execution_context()
        self.stream = torch.cuda.Stream()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode = self.engine.get_tensor_mode
        self.input_names = [n for n in names if mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if mode(n) == trt.TensorIOMode.OUTPUT]
        self.buffers: dict = {}
        self._shapes = None
        self._graph = None

    def deactivate_impl(self):
        self._torch.cuda.synchronize()
        del self._graph, self.buffers, self.context, self.stream, self.engine

    def get_input_metadata_impl(self):
        from polygraphy.common import TensorMetadata
        from polygraphy.datatype import DataType

        meta = TensorMetadata()
        for n in self.input_names:
            meta.add(n, dtype=DataType.from_dtype(self.engine.get_tensor_dtype(n), "tensorrt"),
                     shape=tuple(self.engine.get_tensor_shape(n)))
        return meta

    # ---------------------------------------------------------------- shapes and buffers
    def bind(self, context, shapes: dict[str, tuple]) -> None:
        """Select a profile, set input shapes, (re)allocate buffers, set tensor addresses."""
        torch = self._torch
        if switch_profile(context, choose_profile(self.engine, shapes), self.stream.cuda_stream):
            self.details["profile_switches"] += 1
        for n, shape in shapes.items():
            if not context.set_input_shape(n, shape):
                raise StageFailed(f"TensorRT refused shape {shape} for input `{n}`")
        for n in self.input_names + self.output_names:
            shape = tuple(shapes[n]) if n in shapes else tuple(context.get_tensor_shape(n))
            dtype = _torch_dtype(self._trt, torch, self.engine.get_tensor_dtype(n))
            buf = self.buffers.get(n)
            if buf is None or tuple(buf.shape) != shape:
                self.buffers[n] = torch.empty(shape, dtype=dtype, device="cuda")
            set_address(context, n, self.buffers[n].data_ptr())

    def _enqueue(self, context) -> None:
        if not context.execute_async_v3(self.stream.cuda_stream):
            raise StageFailed("TensorRT execute_async_v3 failed (see the TensorRT log above)")
        self.details["enqueues"] += 1

    def _capture(self) -> None:
        """Warm enqueue, then capture one enqueue as a CUDA Graph (or record why not).

        Called on the runner's stream, inputs already copied in."""
        torch = self._torch
        self._enqueue(self.context)  # flushes TensorRT's deferred work after a shape change
        self.stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=self.stream, capture_error_mode=CAPTURE_MODE):
                if not self.context.execute_async_v3(self.stream.cuda_stream):
                    raise RuntimeError("execute_async_v3 returned False during capture")
        except Exception as e:  # noqa: BLE001 - any capture failure means: plain enqueue
            self.details["capture_failure"] = f"{type(e).__name__}: {e}"
            self.details["cuda_graphs"] = "fallback to plain enqueue (capture failed)"
            self.cuda_graphs = False
            self._graph = None
            return
        self._graph = graph
        self.details["captures"] += 1

    # ---------------------------------------------------------------- inference
    def infer_impl(self, feed_dict):
        torch = self._torch
        start = time.perf_counter()
        shapes = {n: tuple(np.shape(feed_dict[n])) for n in self.input_names}
        # Everything on the runner's stream, in order: copies in, enqueue or replay, copies out.
        with torch.cuda.stream(self.stream):
            if shapes != self._shapes:
                self._graph = None  # a graph holds fixed shapes and addresses: capture again
                self.bind(self.context, shapes)
                self._shapes = shapes
            for n in self.input_names:
                host = torch.from_numpy(np.ascontiguousarray(feed_dict[n]))
                self.buffers[n].copy_(host.to(self.buffers[n].dtype))
            if self.cuda_graphs and self._graph is None:
                self._capture()
            if self._graph is not None:
                self._graph.replay()
                self.details["replays"] += 1
            else:
                self._enqueue(self.context)
            out = OrderedDict()
            for n in self.output_names:
                t = self.buffers[n]
                t = t.float() if t.is_floating_point() and t.dtype != torch.float32 else t
                out[n] = t.cpu().numpy()  # blocking copy: the stream's work is done after it
        self.stream.synchronize()
        self.inference_time = time.perf_counter() - start
        return out

    # ---------------------------------------------------------------- layer truth
    def layer_times(self, feed_dict, iterations: int = 20) -> LayerTimes:
        """Median ms per engine layer (IProfiler on a second context; plain enqueues)."""
        trt, torch = self._trt, self._torch

        class _Timer(trt.IProfiler):
            def __init__(self):
                trt.IProfiler.__init__(self)
                self.samples: dict[str, list[float]] = {}

            def report_layer_time(self, layer_name, ms):
                self.samples.setdefault(layer_name, []).append(ms)

        self.infer(feed_dict, check_inputs=False)  # binds shapes and buffers
        context = self.engine.create_execution_context()
        timer = _Timer()
        context.profiler = timer
        self.bind(context, self._shapes)
        with torch.cuda.stream(self.stream):
            for _ in range(iterations):
                self._enqueue(context)
                self.stream.synchronize()
        del context
        self.bind(self.context, self._shapes)  # buffers may have moved: rebind the main context
        self._graph = None
        return {name: statistics.median(v) for name, v in timer.samples.items()}

    def inspector_json(self) -> str:
        """The engine inspector's JSON for the current shapes (formats resolved)."""
        inspector = self.engine.create_engine_inspector()
        inspector.execution_context = self.context
        return inspector.get_engine_information(self._trt.LayerInformationFormat.JSON)
