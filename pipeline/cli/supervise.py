"""A build runs in a child process that must say it finished: user code cannot fake success.

A recipe's model factory, data loaders and tokenizer functions run inside `pipeline run` (and
its stage commands). `sys.exit()` in them is refused where they are called
(core.user_code.exits_refused), but `os._exit(0)`, a signal handler that exits, or libc's
exit() end the interpreter at once: no `except`, `finally` or atexit in that process runs, so
nothing in it can stop an exit status 0 with nothing built.

Only another process can tell. So the command forks before any work (only click, rich and
pydantic are imported then, no threads): the child runs the command as before; its atexit
hook, which runs on every ordinary end (a return, sys.exit, an error, Ctrl-C), writes one byte
into a pipe. The parent waits and takes the child's status as its own, except an exit 0
without that byte: then it prints one `Error:` line, exit 2 (user code's exit code).

Why this and not the alternatives: running only the user code in a child would have to ship
a PyTorch model back across processes; patching os._exit misses libc and signal handlers.
The child is its own process group so a terminal's Ctrl-C reaches it once (forwarded by the
parent, as SIGTERM and SIGHUP are) and dies with the parent (PR_SET_PDEATHSIG), so a SIGKILL
of the command still stops the build at once. A child that dies of a signal makes the parent
die of the same one.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys

FINISHED = b"1"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
ENDED_EARLY = ("Error: the run ended with exit status 0 before it finished: code the recipe runs "
               "(its model factory, a data loader, a tokenizer function) ended the process itself "
               "(os._exit, a signal handler, exit()); nothing it left counts as built (return from "
               "the function, or raise an exception that says what is wrong)")


def wanted(args: list[str], commands: set[str]) -> bool:
    """Whether the command line names one of `commands` (the first word not an option)."""
    word = next((a for a in args if not a.startswith("-")), None)
    return word in commands and hasattr(os, "fork")


def in_child() -> None:
    """Fork; return in the child (which runs the command); the parent never returns."""
    parent = os.getpid()
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.setpgid(0, 0)
        _die_with(parent)
        atexit.register(os.write, write_end, FINISHED)
        return
    os.close(write_end)
    _parent(pid, read_end)


def _die_with(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux); already orphaned: end now."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


def _parent(pid: int, read_end: int) -> None:
    for sig in FORWARDED:
        signal.signal(sig, lambda number, _frame: os.kill(pid, number))
    _, status = os.waitpid(pid, 0)  # PEP 475: retried after each forwarded signal
    os.set_blocking(read_end, False)  # a grandchild may still hold the write end
    try:
        finished = os.read(read_end, 1) == FINISHED
    except BlockingIOError:
        finished = False
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    code = os.waitstatus_to_exitcode(status)
    code = 128 - code if code < 0 else code  # a signal this process could not die of
    if code == 0 and not finished:
        print(ENDED_EARLY, file=sys.stderr)
        code = 2
    os._exit(code)
