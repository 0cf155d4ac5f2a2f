"""Names CI needs for a recipe's engines: `python -m pipeline.commands.ci RECIPE [ENGINES_DIR]`.

Prints GitHub Actions step outputs (`key=value` lines, appended to $GITHUB_OUTPUT by the
workflow): what the artifact and the TensorRT timing cache are called on this runner.

    gpu=nvidia-h200            the GPU, or `cpu` where there is none
    tensorrt=10.13.0           the TensorRT version, or `none`
    kinds=onnxruntime,tensorrt the recipe's target kinds (a job skips a recipe without its kind)
    artifact=engines-flash-nvidia-h200-trt10.13.0
    cache_key=trt-timing-nvidia-h200-10.13.0

GPU and TensorRT version come from the recipe's manifest when it exists (what the engines
were built with), else from this machine (what they are about to be built with): a plan
runs only on the GPU and TensorRT version it was built for, so both name the artifact, and
a timing cache is only valid for them, so both key the cache.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline import recipe as recipe_mod
from pipeline.core import deps
from pipeline.store.recipe_folder import MANIFEST, Store


def slug(text: str) -> str:
    """Lower case, runs of anything but letters, digits, dots and dashes to one dash."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "none"


@dataclass(frozen=True)
class CiNames:
    """The step outputs above, in that order."""

    gpu: str
    tensorrt: str
    kinds: str
    artifact: str
    cache_key: str

    def lines(self) -> list[str]:
        return [f"{k}={v}" for k, v in vars(self).items()]


def names(recipe_ref: str, engines_dir: Path = Path("engines")) -> CiNames:
    recipe = recipe_mod.load(recipe_ref)
    manifest_path = engines_dir / recipe.name / MANIFEST
    if manifest_path.is_file():  # read through its model: a bad one is IntegrityError (exit 5)
        manifest = Store(engines_dir, recipe.name).read_manifest()
        gpu_name = manifest.device.gpu if manifest.device else None
        versions = manifest.versions
    else:
        gpu_name, versions = deps.identity().gpu, deps.versions()
    gpu = slug(gpu_name or "cpu")
    trt = slug(versions.get("tensorrt") or "none")
    return CiNames(gpu=gpu, tensorrt=trt, kinds=",".join(sorted({t.kind for t in recipe.targets})),
                   artifact=f"engines-{recipe.name}-{gpu}-trt{trt}", cache_key=f"trt-timing-{gpu}-{trt}")


def main(argv: list[str]) -> int:
    from pipeline.core.errors import PipelineError

    if not 1 <= len(argv) <= 2:
        print("usage: python -m pipeline.commands.ci RECIPE [ENGINES_DIR]", file=sys.stderr)
        return 2
    try:
        values = names(argv[0], Path(argv[1]) if len(argv) > 1 else Path("engines"))
    except PipelineError as e:
        print(f"Error: {e}", file=sys.stderr)
        return e.exit_code
    print("\n".join(values.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
