"""User-facing errors: one clean message, a distinct exit code, no traceback.

Anything that is the user's to fix (a recipe, an input file, a missing dependency for a
required target) raises a PipelineError subclass; the CLI prints `Error: <message>` and
exits with the class's code. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base class: the message is the whole story, written for the user."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        text = self.message if not self.hint else f"{self.message} ({self.hint})"
        # One line, always: user text (a key, a path, a --set value) may hold line breaks.
        return text.replace("\r", "\\r").replace("\n", "\\n")


class RecipeError(PipelineError):
    """The recipe (or a --set override) is malformed or inconsistent."""

    exit_code = 2


class InputError(PipelineError):
    """A file the user pointed at (data, weights, ONNX) is missing or unusable."""

    exit_code = 2


class DependencyError(PipelineError):
    """A required target needs a package or device this machine does not have."""

    exit_code = 2


class GateFailed(PipelineError):
    """An engine missed a gate (accuracy, speed) the recipe demands."""

    exit_code = 3


class StageFailed(PipelineError):
    """A stage could not produce its artifact (export crashed, parity broke, build failed)."""

    exit_code = 4


class IntegrityError(PipelineError):
    """An artifact no longer matches the sha256 recorded in its manifest."""

    exit_code = 5


class LockError(PipelineError):
    """Another run holds the lock on this recipe's output folder."""

    exit_code = 6
