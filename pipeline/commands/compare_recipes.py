"""`pipeline compare A B [...]`: several recipes side by side, by their workload.

0. At least two recipes, none named twice, all of one workload; then the workload's own
   check before anything is built (the forward pass: the first recipe's timing feed fits
   every other one; generation: the same script of requests).
1. Each recipe is run up to its report (cached stages are reused).
2. The workload's comparer times and explains them (workloads.comparer: compare/tensor.py
   for the forward pass, compare/generation.py) and writes engines/compare/<A>-vs-<B>.../.
"""

from __future__ import annotations

from pathlib import Path

from pipeline import workloads
from pipeline.core import safe_files
from pipeline.core.errors import RecipeError
from pipeline.core.json_object import JsonObject
from pipeline.recipe import Recipe

Reports = dict[str, JsonObject]  # a recipe's name -> its report.json, as the comparers read it


def compare(recipes: list[Recipe], root: Path, force: bool, progress, verbose: bool) -> workloads.Compared:
    if len(recipes) < 2:
        raise RecipeError("compare needs at least two recipes (e.g. `pipeline compare standard flash`)")
    names = [r.name for r in recipes]
    if len(set(names)) != len(names):
        raise RecipeError(f"compare: a recipe is named twice ({', '.join(names)})")
    # The output folder is checked before any work (a link in its place is exit 5), and made
    # the same way when the results are written (workloads.base.compare_folder).
    safe_files.folder(root, "compare", "-vs-".join(r.name for r in recipes), create=False)
    first = recipes[0]
    for other in recipes[1:]:
        if workloads.of(other) is not workloads.of(first):
            raise RecipeError(f"compare: `{first.name}` runs workload {first.workload.kind}, "
                              f"`{other.name}` runs {other.workload.kind}",
                              "compare recipes of one workload with each other")
    comparer = workloads.comparer(first)
    comparer.check_comparable(recipes)
    return comparer.compare(recipes, run_all(recipes, root, force, progress, verbose), root, progress)


def run_all(recipes: list[Recipe], root: Path, force: bool, progress, verbose: bool) -> Reports:
    """Each recipe run up to its report: {recipe name: report.json's content}."""
    from pipeline.artifacts import dump
    from pipeline.run.execute import Run

    reports = {}
    for r in recipes:
        outcome = Run(r, root, force=force, progress=progress, verbose=verbose).execute("report")
        reports[r.name] = dump(outcome.report)  # what report.json holds: the comparers read that
    return reports
