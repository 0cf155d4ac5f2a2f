"""`pipeline predict RECIPE --device NAME`: the roofline floors of a built recipe's engines on
a device of the hardware database (pipeline/roofline/predict.py)."""

from __future__ import annotations

import click

from pipeline.cli.options import debug_option, engines_dir_option


@click.command("predict")
@click.argument("recipe")
@click.option("--device", "name", default="this", show_default=True,
              help="`this` (measured here, cached) or a specified device: a100, h100, h200, l4, l40s, "
                   "rtx4090, xeon-8480, epyc-9654 (`pipeline hw --list`).")
@click.option("--context", type=click.IntRange(min=0), default=None,
              help="Tokens in the KV cache for the decode step (default: each point's prompt + half its new tokens).")
@click.option("--json", "as_json", is_flag=True, help="Print the prediction as JSON.")
@click.option("--serve", "serve", is_flag=True, help="Suggest serve.max_running_sequences and kv_cache_tokens "
              "from the decode step's floor by batch size and the graph's KV bytes per token (a model's suggestion).")
@engines_dir_option()
@debug_option
def predict_command(recipe, name, context, as_json, serve, engines_dir):
    """Lower bounds of TTFT / TPOT / time per task (generation) or latency per batch (forward)
    for each built engine on a device: from its maker's specifications, or from this machine's
    measured figures with the measured times beside them; and the ops that would not run
    there as built."""
    import dataclasses
    import json

    from pipeline import workloads
    from pipeline.core.errors import InputError
    from pipeline.core.ui import out
    from pipeline.hardware import database
    from pipeline.roofline import predict, predict_render
    from pipeline.store import folder_names as folders

    loaded = folders.load(recipe, (), engines_dir)
    folder = engines_dir / folders.folder_name(loaded)
    if not (folder / "report.json").is_file():
        raise InputError(f"{folder}: no report.json: the recipe is not built there",
                         f"run `pipeline run {recipe}` first, or name the folder with --engines-dir")
    looked = database.lookup(name)
    if serve:
        _serve(predict.serve_suggestions(loaded, folder, looked), as_json)
        return
    workload = workloads.of(loaded)  # its roofline points
    result = predict.predict(loaded, folder, looked, workload, context)
    here = None  # this machine's efficiency, shown beside a specified device's floors
    if looked.entry.provenance == "specified" and database.this_machine_cached():
        here = predict.predict(loaded, folder, database.this_machine(), workload, context)
    if as_json:
        click.echo(json.dumps({"prediction": dataclasses.asdict(result),
                               "here": dataclasses.asdict(here) if here else None}, indent=1, default=str))
        return
    for line in predict_render.header(result):
        out.print(line)
    for part in predict_render.tables(result):
        out.print(part)
    if here is not None:
        for line in predict_render.efficiency_lines(here):
            out.print(line)


def _serve(found: list, as_json: bool) -> None:
    """Print each engine's suggestion; exit 2 when no engine has one (no KV cache to size)."""
    import dataclasses
    import json

    from pipeline.core.errors import InputError
    from pipeline.core.ui import out
    from pipeline.roofline import predict_render

    if not any(not isinstance(got, str) for _, got in found):
        reasons = "; ".join(f"{target}: {got}" for target, got in found) or "no built engine"
        raise InputError(f"--serve: nothing to suggest from ({reasons})",
                         "--serve sizes a generation engine's decode batch and KV cache")
    if as_json:
        click.echo(json.dumps({t: got if isinstance(got, str) else dataclasses.asdict(got) for t, got in found},
                              indent=1))
        return
    for target, got in found:
        for part in predict_render.serve_parts(target, got):
            out.print(part)
