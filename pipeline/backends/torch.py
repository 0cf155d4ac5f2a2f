"""PyTorch runners: the eager baseline every engine is validated against."""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np
from polygraphy.backend.base import BaseRunner


class TorchRunner(BaseRunner):
    """Eager PyTorch behind Polygraphy's runner interface (its PytRunner assumes CUDA).

    feed: numpy arrays by input name (in forward() order) -> numpy outputs by `output_names`.
    """

    def __init__(self, model, input_names: list[str], output_names: list[str],
                 threads: int | None = None, name: str = "torch-eager"):
        super().__init__(name=name, prefix="torch-runner")
        self.model, self.input_names, self.output_names = model, input_names, output_names
        self.threads = threads

    def activate_impl(self):
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
        self._torch = torch

    def get_input_metadata_impl(self):
        from polygraphy.common import TensorMetadata

        return TensorMetadata()  # shapes are dynamic; the model checks its own inputs

    def infer_impl(self, feed_dict):
        torch = self._torch
        args = [torch.from_numpy(np.ascontiguousarray(feed_dict[n])) for n in self.input_names]
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model(*args)
        self.inference_time = time.perf_counter() - start
        if isinstance(out, torch.Tensor):
            out = (out,)
        elif isinstance(out, dict):
            out = tuple(out.values())
        if len(out) != len(self.output_names):
            raise ValueError(
                f"the model returned {len(out)} outputs; the recipe names {len(self.output_names)}: "
                f"{self.output_names}"
            )
        return OrderedDict(
            (n, t.detach().float().numpy() if t.is_floating_point() else t.detach().numpy())
            for n, t in zip(self.output_names, out)
        )

    def deactivate_impl(self):
        del self._torch
