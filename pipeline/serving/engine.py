"""The engine a replica serves: the recipe's built engine folder checked the way `pipeline
verify` checks it (a refused folder is IntegrityError, exit 5), the engine chosen by target
id or kind (or `pytorch`, the baseline), and opened through its backend's Runner.

    engine = ServedEngine(recipe, choose(recipe, Path("engines"), "onnxruntime"), threads=1)
    engine.infer(feed) -> {output name: array}          # forward engines, a batch feed
    engine.generate(prompt_ids, params) -> iterator of ids   # generation engines, one prompt
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline import backends
from pipeline.core.errors import InputError, IntegrityError
from pipeline.generation.sampling import SamplingParams
from pipeline.recipe.serve import variable_dims
from pipeline.store import integrity
from pipeline.store.folder_names import folder_name
from pipeline.store.recipe_folder import MANIFEST, Store

PYTORCH = "pytorch"  # --engine pytorch: the recipe's PyTorch model, as the baseline runs it


@dataclass
class Choice:
    """Which engine of the folder is served (checked, not yet opened)."""

    target: str          # the target id, or "pytorch"
    kind: str            # backend kind, or "pytorch"
    path: Path | None    # the engine file (None: pytorch)
    sha256: str | None
    graph: Path | None   # the ONNX graph it was built from (output dim names), if any


def check_folder(recipe, engines_root: Path) -> Path:
    """engines/<recipe>/, refused (exit 5) where `pipeline verify` would refuse it."""
    folder = Path(engines_root) / folder_name(recipe)
    if not (folder / MANIFEST).is_file():
        raise InputError(f"{folder}: no {MANIFEST}; nothing was built there",
                         f"run `pipeline run {recipe.name}` first")
    verdict = integrity.verify(folder)
    bad = verdict.mismatches
    if bad:
        names = ", ".join(f"{c.what} ({c.detail})" for c in bad[:4]) + (" ..." if len(bad) > 4 else "")
        raise IntegrityError(f"{folder}: `pipeline verify` refuses it: {len(bad)} of "
                             f"{len(verdict.checks)} checks failed: {names}",
                             f"rebuild with `pipeline run {folder.name} --force`, or serve the "
                             "engines only where they were built")
    return folder


def choose(recipe, engines_root: Path, wanted: str | None) -> Choice:
    """The engine to serve: `wanted` (a target id or kind, or `pytorch`), else the first
    built engine of the report that runs here."""
    folder = check_folder(recipe, engines_root)
    if wanted == PYTORCH:
        return Choice(PYTORCH, PYTORCH, None, None, None)
    store = Store(folder.parent, folder.name)
    if "report.json" not in store.manifest.files:
        raise InputError(f"{folder}: no report.json; the engines were not validated",
                         f"run `pipeline run {recipe.name}`")
    entries = store.read_json("report.json")["engines"]
    built = [e for e in entries if e.get("status") == "built"]
    pick = [e for e in built if wanted in (None, e["target"], e.get("kind"))]
    runnable = [e for e in pick if backends.lookup(e.get("kind")) is not None
                and backends.get(e["kind"]).unavailable(_target(recipe, e["target"])) is None]
    if not runnable:
        have = ", ".join(f"{e['target']} ({e.get('status')})" for e in entries) or "none"
        raise InputError(f"{folder}: no built engine{f' `{wanted}`' if wanted else ''} that runs "
                         f"here (engines: {have})",
                         f"name one with --engine (a target id or kind, or `{PYTORCH}`)")
    entry = runnable[0]
    stage = store.stage_record(f"build:{entry['target']}")
    name = (stage.outputs if stage and stage.outputs else [Path(entry["path"]).name])[0]
    artifact = store.verify(name)
    if artifact.sha256 != entry.get("sha256"):
        raise IntegrityError(f"{artifact.path}: not the engine the report validated",
                             f"rebuild with `pipeline run {folder.name} --force`")
    source = (stage.meta if stage else {}).get("source", "model.onnx")
    graph = store.verify(source).path if source in store.manifest.files else None
    return Choice(entry["target"], entry["kind"], artifact.path, artifact.sha256, graph)


def _target(recipe, target_id: str):
    return next(t for t in recipe.targets if t.id == target_id)


def output_axes(recipe, graph: Path | None) -> dict[str, dict[int, str]]:
    """output -> {axis: variable dim symbol}, from the ONNX graph's output dim names."""
    if graph is None:
        return {}
    import onnx

    from pipeline.core import safe_files

    symbols = set(variable_dims(recipe.inputs))
    model = onnx.load_from_string(safe_files.read_bytes(graph))
    return {o.name: {axis: d.dim_param for axis, d in enumerate(o.type.tensor_type.shape.dim)
                     if axis and d.dim_param in symbols}
            for o in model.graph.output}


class ServedEngine:
    """An opened engine: `infer` for forward recipes, `generate` for generation recipes."""

    def __init__(self, recipe, choice: Choice, threads: int | None, spin: bool = False):
        """spin: a generation engine's ONNX Runtime workers spin-wait inside a call (serve.spin)."""
        self.recipe, self.choice = recipe, choice
        self.generation = recipe.workload.served_as == "generate"
        self._runner = self._gen = None
        if self.generation:
            self._gen, self.eos = _generation_runner(recipe, choice, threads, spin)
        elif choice.kind == PYTORCH:
            from pipeline.backends.openers import baseline_runner
            from pipeline.model import sources as models

            self._runner = baseline_runner(recipe, models.load(recipe))
            self._runner.threads = threads
        else:
            backend = backends.get(choice.kind)
            self._runner = backend.open(choice.path, _target(recipe, choice.target), recipe,
                                        threads=threads, spin=False)  # idle replicas must not spin
        if self._runner is not None:
            self._runner.activate()

    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = self._runner.infer(feed, check_inputs=False)  # collate.check did: shapes vary
        return {name: np.asarray(outputs[name]) for name in outputs}

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[int]:
        """One prompt's tokens, one at a time (prefill, then decode steps), each chosen by
        sampling.next_token with the request's params; ends before EOS or a stop id (neither is
        yielded), or after max_new_tokens."""
        from pipeline.generation.sampling import ends_sequence, next_token

        runner, rng = self._gen, params.generator()
        runner.new(1)
        runner.prefill(np.asarray([prompt_ids], np.int64))
        for i in range(params.max_new_tokens):
            if i:
                runner.step()  # feeds runner.last, the token chosen below
            token = next_token(runner.logits[0], params, rng, self.eos)
            if ends_sequence(token, params, self.eos):
                return
            runner.last = np.array([token], np.int64)
            yield token

    def slots(self, wanted: int):
        """The generation engine as slots of a KV cache, each holding the recipe's context:
        (BatchedSlots of `wanted` rows, None) on a graph that keeps its cache in place
        (GroupQueryAttention), else (OneSlot, why it serves one sequence at a time)."""
        from pipeline.generation.decoder import context_length
        from pipeline.generation.runners import OrtLoopRunner
        from pipeline.generation.slots import BatchedSlots, OneSlot

        width = context_length(self.recipe)
        if isinstance(self._gen, OrtLoopRunner) and self._gen.in_place:
            return BatchedSlots(self._gen, wanted, width), None
        if self.choice.kind == PYTORCH:
            why = "the PyTorch baseline's static cache holds one sequence"
        else:
            why = ("the graph concatenates its KV cache (no GroupQueryAttention): its rows cannot "
                   "be at different lengths")
        return OneSlot(self._gen, width), why

    def close(self) -> None:
        if self._runner is not None and self._runner.is_active:
            self._runner.deactivate()
        if self._gen is not None:
            self._gen.close()


def _generation_runner(recipe, choice: Choice, threads: int | None, spin: bool):
    from pipeline.generation import runners
    from pipeline.generation.decoder import context_length, eos_token

    eos = eos_token(recipe)
    if choice.kind == PYTORCH:
        from pipeline.model import sources as models

        decoder = runners.torch_decoder(recipe, models.load(recipe), context_length(recipe))
        return runners.TorchStaticRunner(decoder, eos, threads), eos
    if not getattr(backends.lookup(choice.kind), "ENGINE_IS_ONNX", False):  # the loop binds an ONNX graph
        raise InputError(f"generation engines are served on ONNX Runtime or PyTorch here, not "
                         f"`{choice.kind}`", f"--engine onnxruntime or --engine {PYTORCH}")
    return runners.OrtLoopRunner(choice.path, eos, threads, spin=spin), eos
