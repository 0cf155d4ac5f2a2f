"""The `pipeline` command: the click group, its subcommands (one module each in this
package, named for the command) and the entry point `main` (pyproject's console script and
`python -m pipeline`).

Imports here stay light (click, rich, pydantic): torch and onnxruntime are imported by the
stages only when there is work to do, so `pipeline --help` is instant.
"""

from __future__ import annotations

import sys

import click

from pipeline import __version__
from pipeline.cli import (
    bench,
    compare,
    deploy,
    fleet,
    generate,
    hw,
    inspect,
    keygen,
    load,
    predict,
    recipes,
    run,
    schema,
    serve,
    sign,
    supervise,
    tune,
    verify,
)
from pipeline.cli.options import DEBUG, debug_option
from pipeline.core.errors import PipelineError
from pipeline.core.text import printable


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pipeline")
@debug_option
def cli():
    """Turn PyTorch model variants into engines and prove what each engine is worth.

    RECIPE is a name under recipes/ (e.g. `standard`) or a path to a YAML file. A run with
    --set values writes into engines/RECIPE@<8 hex digits>/ (printed as `engines: ...`), never
    into engines/RECIPE/; that folder name also works as RECIPE (it brings its --set values).
    """
    from pipeline import backends

    backends.load_plugins()  # third-party target kinds, before any recipe is read


# Each command in its own module, named for it; click lists them sorted, whatever the order here.
for _command in (*run.COMMANDS, bench.bench_command, compare.compare_command,
                 deploy.deploy_command, fleet.fleet, generate.generate_command, hw.hw_command,
                 inspect.inspect_command,
                 keygen.keygen_command, load.load_command, predict.predict_command, recipes.recipes_command,
                 schema.schema_command, serve.serve_command, sign.sign_command, tune.tune_command,
                 verify.verify_command):
    cli.add_command(_command)


def _fail(message: str, code: int, debug: bool) -> None:
    """One `Error:` line and the error's own exit code; under --debug the trace first."""
    if debug:
        import traceback

        traceback.print_exc()
    click.echo(printable(message.replace("\n", " ")), err=True)  # a file's ESC never raw
    sys.exit(code)


INTERRUPTED = "Interrupted; finished artifacts are kept, a rerun resumes."


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one `Error:` line and their exit code."""
    meta: dict = {}  # this invocation's state (--debug), read here after the command ended
    if argv is None and supervise.wanted(sys.argv[1:], {c.name for c in run.COMMANDS}):
        supervise.in_child()  # a build: user code ending the process cannot look like success
    try:
        rv = cli.main(args=argv, prog_name="pipeline", standalone_mode=False, obj=meta)
    except PipelineError as e:
        _fail(f"Error: {e}", e.exit_code, meta.get(DEBUG, False))
    except click.exceptions.Abort as e:
        # click turns Ctrl-C (KeyboardInterrupt) into Abort before it gets here
        interrupted = isinstance(e.__cause__, KeyboardInterrupt)
        click.echo(INTERRUPTED if interrupted else "Aborted.", err=True)
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as e:  # bare `pipeline`: the help, a success
        e.show()
        sys.exit(0)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except OSError as e:  # the machine's to fix (disk full, read-only, permissions): no trace
        _fail(f"Error: {e} (rerun with --debug for the trace)", 4, meta.get(DEBUG, False))
    except KeyboardInterrupt:
        click.echo(INTERRUPTED, err=True)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)
