"""`pipeline load A --versus B`: two recipes (or serving variants) measured in one run,
taking turns point by point (turns.py: A's first point, B's first, A's second...).

Both servers are up for the whole run (started here with --serve, or running at --url and
--versus-url); only one is loaded at a time, so the other idles. Every setting is the same
for both: mode, rates, seed and so the arrival schedule, SLO, durations, and the serve
settings unless --versus-set gives B its own (two serving variants of one recipe).
Each side's result is written into its own folder as a plain `pipeline load` writes it, with
`client.interleaved_with` naming the other; then `pipeline compare A B --load`'s verdicts
are printed and written, saying the two were measured in turns.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import replace
from pathlib import Path

from pipeline.core.errors import InputError
from pipeline.loadgen.command import Request, reach


def check(req: Request, versus: str | None, versus_url: str | None,
          versus_overrides: tuple[str, ...] = ()) -> None:
    """InputError when --versus and its server do not go together with the other flags."""
    if versus is None:
        if versus_url or versus_overrides:
            flag = "--versus-url" if versus_url else "--versus-set"
            raise InputError(f"{flag} is for the server of --versus B: it needs --versus",
                             "e.g. pipeline load A --url URL_A --versus B --versus-url URL_B")
        return
    if versus_overrides and not req.start_server:
        raise InputError("--versus-set needs --serve: a running server has its settings already",
                         "drop --versus-set, or start both servers here with --serve")
    if req.soak:
        raise InputError("--soak with --versus: a soak is one long point, there is nothing to "
                         "take turns on", "soak each recipe on its own")
    if req.start_server and versus_url:
        raise InputError("--versus-url with --serve: --serve starts both servers here",
                         "drop --versus-url, or give A's running server with --url")
    if req.url and not versus_url:
        raise InputError(f"--versus {versus} with --url: B's running server is not named",
                         "add --versus-url URL_B, or start both here with --serve")


def run(req: Request, versus: str, versus_url: str | None,
        versus_overrides: tuple[str, ...] = ()) -> None:
    """Measure A (`req`) and B (`versus`, RECIPE[:NAME]; its serve settings `versus_overrides`
    where given, else A's) in turns; write both results and their comparison."""
    from pipeline.core.ui import console
    from pipeline.loadgen import command, load_compare, task_command, turns

    recipe_b, name_b = load_compare.split_ref(versus)
    req_b = replace(req, recipe=recipe_b, name=name_b, url=versus_url, model=None, server_pid=None,
                    overrides=tuple(versus_overrides) or req.overrides)
    kind = task_command.TaskRun if req.tasks else command.RequestRun
    sides = [kind.prepare(req, " [A]"), kind.prepare(req_b, " [B]")]
    refs = [_ref(side) for side in sides]
    if refs[0] == refs[1]:
        raise InputError(f"--versus {versus}: the same recipe and name as A ({refs[0]})",
                         "name B's serving variant, e.g. --versus RECIPE:b1 --versus-url URL")
    console.print(f"load: {refs[0]} (A) against {refs[1]} (B), taking turns point by point")
    logs = [Path(tempfile.mkdtemp(prefix="pipeline-load-")) for _ in sides]
    with contextlib.ExitStack() as servers:
        reached = [servers.enter_context(reach(side.req, side.recipe, side.api, log))
                   for side, log in zip(sides, logs)]
        for side, got in zip(sides, reached):
            side.start(got)
        measured = turns.in_turns([side.plan() for side in sides])
    for side, result, got, log, other in zip(sides, measured, reached, logs, reversed(refs)):
        side.write(result, got, log, interleaved_with=other)
    load_compare.show(refs, (), req.engines_dir)


def _ref(side) -> str:
    """How compare --load names the side's results: FOLDER[:NAME] (tasks: their default name)."""
    name = side.req.name or side.default_name
    return f"{side.folder}:{name}" if name else side.folder
