"""`pipeline hw [--device NAME] [--remeasure] [--list] [--json]`: the hardware feature
database (pipeline/hardware): this machine's measured entry (cached per device identity) or
a device's published specifications."""

from __future__ import annotations

import click

from pipeline.cli.options import debug_option


@click.command("hw")
@click.option("--device", "name", default="this", show_default=True,
              help="`this` (measured here) or a specified device: a100, h100, h200, l4, l40s, rtx4090, "
                   "xeon-8480, epyc-9654.")
@click.option("--remeasure", is_flag=True, help="Measure this machine again (replaces its cached entry).")
@click.option("--list", "list_all", is_flag=True, help="One line per entry of the database.")
@click.option("--json", "as_json", is_flag=True, help="Print the entry as JSON.")
@debug_option
def hw_command(name, remeasure, list_all, as_json):
    """Memory bandwidth per level and peak arithmetic per data type, with the instruction set
    behind each: measured once per device identity here (then read back), or specified."""
    from pipeline.core.ui import console, out
    from pipeline.hardware import database, specified, tables

    if list_all:
        entries = [database.this_machine().entry, *specified.entries()]
        if as_json:
            click.echo("[" + ",\n".join(e.model_dump_json(indent=1) for e in entries) + "]")
        else:
            out.print(tables.listing(entries))
        return
    if name.lower() == database.THIS and (remeasure or not database.this_machine_cached()):
        console.print("measuring this machine (memory levels, then peaks; ~15 s) ...")
    looked = database.lookup(name, remeasure)
    if as_json:
        click.echo(looked.entry.model_dump_json(indent=1))
        return
    for line in tables.header(looked.entry):
        out.print(line)
    if looked.entry.provenance == "measured":
        how = ("cached figures reused (measured " + looked.entry.source.date + "; --remeasure redoes it)"
               if looked.cached else "measured now")
        out.print(f"{how}: {looked.path}")
    out.print(tables.bandwidth_table(looked.entry))
    out.print(tables.peak_table(looked.entry))
