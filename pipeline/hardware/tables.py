"""`pipeline hw`'s tables: an entry's bandwidth per level and peak per data type, by thread
count for a measured entry; the list of every entry."""

from __future__ import annotations

from rich.table import Table

from pipeline.core.text import escape
from pipeline.hardware.entry import HardwareEntry


def _size(n: int | None) -> str:
    if not n:
        return "-"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.4g} {unit}"
    return f"{n} B"


def _rate(value: float | None, unit: str) -> str:
    if value is None:
        return "not present"
    for prefix, scale in (("T", 1e12), ("G", 1e9)):
        if value >= scale:
            return f"{value / scale:,.1f} {prefix}{unit}"
    return f"{value / 1e6:,.1f} M{unit}"


def _threads(entry: HardwareEntry) -> list[int | None]:
    return sorted({r.threads for r in [*entry.bandwidth, *entry.peaks] if r.threads}) or [None]


def bandwidth_table(entry: HardwareEntry) -> Table:
    threads = _threads(entry)
    table = Table(title=f"{escape(entry.name)}: memory bandwidth (bytes read + written per second)")
    for col in ("level", "capacity", *[f"{t} thread{'s' * (t > 1)}" if t else entry.provenance for t in threads]):
        table.add_column(col, justify="left" if col == "level" else "right")
    for level in dict.fromkeys(b.level for b in entry.bandwidth):
        rows = [b for b in entry.bandwidth if b.level == level]
        by_threads = {b.threads: b for b in rows}
        table.add_row(level, _size(rows[0].capacity_bytes),
                      *[_rate(by_threads[t].bytes_per_s, "B/s") if t in by_threads else "-" for t in threads])
    return table


def peak_table(entry: HardwareEntry) -> Table:
    threads = _threads(entry)
    table = Table(title=f"{escape(entry.name)}: peak arithmetic (a multiply-add counts 2)")
    for col in ("type", "instruction set / unit",
                *[f"{t} thread{'s' * (t > 1)}" if t else entry.provenance for t in threads], "note"):
        table.add_column(col, justify="right" if "thread" in col or col == entry.provenance else "left")
    for dtype in dict.fromkeys(p.dtype for p in entry.peaks):
        rows = [p for p in entry.peaks if p.dtype == dtype]
        by_threads = {p.threads: p for p in rows}
        unit = "OP/s" if dtype.startswith("int") else "FLOP/s"
        cells = [_rate(by_threads[t].ops_per_s, unit) if t in by_threads else
                 ("not present" if not rows[0].present else "-") for t in threads]
        table.add_row(dtype, escape(rows[0].isa), *cells, escape(rows[0].note))
    return table


def header(entry: HardwareEntry) -> list[str]:
    src = entry.source
    lines = [f"{entry.name}: {escape(entry.title)} ({entry.kind}, {entry.provenance}"
             + (f", {entry.cores} {'cores' if entry.kind == 'cpu' else 'SMs'}" if entry.cores else "") + ")",
             f"source: {escape(src.document)}" + (f" <{escape(src.url)}>" if src.url else "") + f", {src.date}"]
    if src.notes:
        lines.append(f"notes: {escape(src.notes)}")
    if entry.runtimes:
        lines.append(f"runtimes: {', '.join(entry.runtimes)}")
    return lines


def listing(entries: list[HardwareEntry]) -> Table:
    table = Table(title="hardware entries")
    for col in ("name", "device", "provenance", "DRAM", "fp32", "bf16", "int8", "source date"):
        table.add_column(col)
    for e in entries:
        def peak(dtype: str, e=e) -> str:
            p = e.peak(dtype)
            return _rate(p.ops_per_s if p else None, "OP/s" if dtype.startswith("int") else "FLOP/s")
        table.add_row(e.name, escape(e.title), e.provenance, _rate(e.memory().bytes_per_s, "B/s"),
                      peak("fp32"), peak("bf16"), peak("int8"), e.source.date)
    return table
