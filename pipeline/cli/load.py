"""`pipeline load RECIPE`: the load generator's command; the work is loadgen/command.py's
(light imports: click only; aiohttp, numpy and the recipe's data load when it runs)."""

from __future__ import annotations

import math

import click

from pipeline.cli.options import debug_option, engines_dir_option

MODES_HELP = """Modes: --rate R (one point), --sweep R1,R2,... (the knee), --slo alone (capacity
search), --concurrency N (closed loop), --rate R --soak (drift over --duration). With --tasks
the load is the recipe's multi-turn chat tasks: rates in tasks/s, --concurrency task-users,
--slo ttft=...,tpot=...[,task=...] the capacity in tasks/s. --versus B measures a second
recipe in the same run, point by point in turns with the first."""


# Bounds: what one client process can send (~400-800 requests/s here: benchmarks/results/
# loadgen-overhead-*.md) with room to spare, a soak of a week, a count that fits in memory.
MAX_RATE = 100_000.0
MAX_DURATION_S = 7 * 24 * 3600.0
MAX_REQUESTS = 10_000_000


class Finite(click.FloatRange):
    """A FloatRange that also refuses nan and inf (a range's comparisons let nan through)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _rates(ctx, param, value):
    if value is None:
        return None
    try:
        rates = [float(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: give rates in requests/s, e.g. 5,10,20") from None
    if not rates or any(not (0 < r <= MAX_RATE) for r in rates):  # nan fails the comparison
        raise click.BadParameter(f"{value!r}: give rates above 0 and at most {MAX_RATE:g}/s, "
                                 "e.g. 5,10,20")
    return sorted(rates)


def _positive(most: float) -> Finite:
    return Finite(min=0, min_open=True, max=most)


@click.command("load", epilog=MODES_HELP)
@click.argument("recipe")
@click.option("--set", "overrides", multiple=True, metavar="serve.KEY=VALUE",
              help="With --serve: a serve: setting for `pipeline serve` (e.g. serve.max_batch_size=1); "
              "needs --name. Other variants: name their engines folder as RECIPE.")
@engines_dir_option("Where engines/<recipe>/ is (env PIPELINE_ENGINES); the result lands there.")
@click.option("--url", default=None, help="A running server: its base URL (e.g. "
              "http://127.0.0.1:8000, an OpenAI base .../v1, or a model's .../v2/models/NAME).")
@click.option("--model", default=None, help="With --url: the model's name on that server "
              "(default: from the URL, else the recipe's name), e.g. what vLLM or llama.cpp serves.")
@click.option("--api", type=click.Choice(["kserve", "chat", "completions"]), default=None,
              help="Generation: OpenAI chat (the chat workload's questions; the default when the "
              "recipe has one) or completions (its prompts as token ids). Tensor: KServe v2.")
@click.option("--serve", "start_server", is_flag=True,
              help="Start `pipeline serve RECIPE` in a subprocess, stop it at the end.")
@click.option("--engine", default=None, help="Target id served (default: the recipe's first).")
@click.option("--name", default=None, help="A name for this serving variant (e.g. b1): "
              "the result is load-<engine>-<name>.json.")
@click.option("--rate", type=_positive(MAX_RATE), default=None,
              help="Offered requests/s (one open-loop point).")
@click.option("--sweep", callback=_rates, default=None, help="Offered rates, comma-separated.")
@click.option("--slo", default=None, help="e.g. p99=50ms; generation: ttft=500ms,tpot=100ms.")
@click.option("--concurrency", type=click.IntRange(min=1, max=10_000), default=None,
              help="Closed loop: this many users, each sending when answered.")
@click.option("--arrival", type=click.Choice(["poisson", "constant", "gamma"]), default="poisson",
              show_default=True)
@click.option("--burstiness", type=_positive(100.0), default=1.0,
              show_default=True, help="Gamma arrivals' coefficient of variation (>1 burstier).")
@click.option("--duration", type=_positive(MAX_DURATION_S), default=10.0,
              show_default=True, help="Seconds measured per point (at least; a soak's length).")
@click.option("--warmup", type=Finite(min=0, max=3600.0), default=2.0, show_default=True,
              help="Seconds of requests sent before measuring, excluded.")
@click.option("--min-requests", type=click.IntRange(min=1, max=MAX_REQUESTS), default=500, show_default=True,
              help="Measured requests per point (at least; the schedule is lengthened).")
@click.option("--timeout", type=_positive(3600.0), default=10.0,
              show_default=True, help="Seconds after its scheduled time a request times out.")
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=0, show_default=True)
@click.option("--max-points", type=click.IntRange(min=2, max=100), default=8, show_default=True,
              help="Capacity search: points at most.")
@click.option("--tolerance", type=_positive(10.0), default=0.05,
              show_default=True, help="Capacity search: stop when the bracket is this narrow.")
@click.option("--start-rate", type=_positive(MAX_RATE), default=None,
              help="Capacity search: first rate (default: from a short closed-loop probe).")
@click.option("--soak", is_flag=True, help="With --rate: report drift in windows and a leak verdict.")
@click.option("--windows", type=click.IntRange(min=2, max=10_000), default=10, show_default=True,
              help="Soak: time windows.")
@click.option("--leak-threshold", type=Finite(min=0, min_open=True), default=10.0, show_default=True,
              help="Soak: MiB/hour of memory growth that is a leak.")
@click.option("--tasks", "tasks", is_flag=True,
              help="Send the recipe's multi-turn chat tasks (workload.chat.tasks), each turn "
              "carrying the conversation so far; rates count tasks/s.")
@click.option("--think-time", type=Finite(min=0, max=3600.0), default=0.0, show_default=True,
              help="With --tasks: seconds between a turn's answer and the next turn.")
@click.option("--min-tasks", type=click.IntRange(min=1, max=MAX_REQUESTS), default=None,
              help="With --tasks: measured tasks per point (default: what the SLO's early "
              "stopping needs, 153 tasks of 3 turns for TTFT/TPOT, 459 with a task term).")
@click.option("--distinct-tasks", is_flag=True,
              help="With --tasks: each task's first message starts with a tag of its own "
              "([#N]), so no two conversations share more than the system prompt (the recipe's "
              "scripts repeat, and a prefix cache would hold them all; users' chats do not "
              "repeat). Replies are then not compared with batch 1's.")
@click.option("--versus", default=None, metavar="RECIPE[:NAME]",
              help="Measure this recipe too, in the same run, taking turns point by point with "
              "RECIPE (ABAB: both see the same machine), then compare them as `pipeline compare "
              "A B --load` does. Every other setting is the same for both.")
@click.option("--versus-url", default=None,
              help="With --url and --versus: the running server of --versus's recipe.")
@click.option("--versus-set", "versus_overrides", multiple=True, metavar="serve.KEY=VALUE",
              help="With --serve and --versus: B's serve settings in place of --set's (e.g. "
              "--set serve.routing=prefix --versus-set serve.routing=balanced).")
@click.option("--server-pid", type=click.IntRange(min=1), default=None,
              help="With --url: sample this server process (and its children) for CPU and memory.")
@debug_option
def load_command(recipe, overrides, engines_dir, url, model, api, start_server, engine, name, rate, sweep, slo,
                 concurrency, arrival, burstiness, duration, warmup, min_requests, timeout, seed,
                 max_points, tolerance, start_rate, soak, windows, leak_threshold, tasks,
                 think_time, min_tasks, distinct_tasks, versus, versus_url, versus_overrides, server_pid):
    """Load-test a served recipe from this (separate) process: latency from each request's
    scheduled send time, capacity at an SLO (MLPerf's early-stopping rule), soak drift.

    Writes engines/RECIPE/load-<engine>.json and a PNG; report.md shows them.
    """
    from pipeline.loadgen import command, task_command
    from pipeline.loadgen import versus as in_turns
    from pipeline.loadgen.command import Request

    req = Request(recipe=recipe, overrides=overrides, engines_dir=engines_dir, url=url, model=model, api=api,
                start_server=start_server, engine=engine, name=name, rate=rate, sweep=sweep,
                slo=slo, concurrency=concurrency, arrival=arrival, burstiness=burstiness,
                duration=duration, warmup=warmup, min_requests=min_requests, timeout=timeout,
                seed=seed, max_points=max_points, tolerance=tolerance, start_rate=start_rate,
                soak=soak, windows=windows, leak_threshold=leak_threshold,
                server_pid=server_pid, tasks=tasks, think_time=think_time, min_tasks=min_tasks,
                  distinct_tasks=distinct_tasks)
    in_turns.check(req, versus, versus_url, versus_overrides)
    if versus:
        return in_turns.run(req, versus, versus_url, versus_overrides)
    run = task_command.run if tasks else command.run  # chat tasks, or single requests
    run(req)
