"""User-facing errors: one clean message, a distinct exit code, no traceback.

Anything that is the user's to fix (a recipe, an input file, a missing dependency for a
required target) raises a PipelineError subclass; the CLI prints `Error: <message>` and
exits with the class's code. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base class: the message is the whole story, written for the user."""

    exit_code = 1

    def __init_subclass__(cls, exit_code: int | None = None, **kwargs):
        """`class RecipeError(PipelineError, exit_code=2)`: each kind names its exit code."""
        super().__init_subclass__(**kwargs)
        if exit_code is not None:
            cls.exit_code = exit_code

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        text = self.message if not self.hint else f"{self.message} ({self.hint})"
        # One line, always: user text (a key, a path, a --set value) may hold line breaks.
        return text.replace("\r", "\\r").replace("\n", "\\n")


class RecipeError(PipelineError, exit_code=2):
    """The recipe (or a --set override) is malformed or inconsistent."""


class InputError(PipelineError, exit_code=2):
    """A file the user pointed at (data, weights, ONNX) is missing or unusable."""


class DependencyError(PipelineError, exit_code=2):
    """A required target needs a package or device this machine does not have."""


class GateFailed(PipelineError, exit_code=3):
    """An engine missed a gate (accuracy, speed) the recipe demands."""


class StageFailed(PipelineError, exit_code=4):
    """A stage could not produce its artifact (export crashed, parity broke, build failed)."""


class IntegrityError(PipelineError, exit_code=5):
    """An artifact no longer matches the sha256 recorded in its manifest."""


class LockError(PipelineError, exit_code=6):
    """Another run holds the lock on this recipe's output folder."""
