"""The base of every error a user's input causes, and how the command line turns one into a single line.

An error is a ``UserInputError`` when the user can fix it by changing what they gave asyncrl (the kinds:
docs/cli.md); ``asyncrl`` prints it as ``asyncrl <command>: error: <message>`` and exits with status 2, without a
traceback. Each such class keeps its older base as well (``class ConfigError(UserInputError, ValueError)``), so code
that catches ``ValueError`` or ``RuntimeError`` catches these too.

This module imports no asyncrl module when it loads (every error module imports it) and nothing from Ray (an
in-process run never loads Ray): a Ray error is recognised by the attributes Ray gives it.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from contextlib import contextmanager


class UserInputError(Exception):
    """An error the user's input caused; its message names the input (config key, file and row, path, URL)."""


# The line that starts a traceback's exception: ``package.module.ClassName: message`` (the message may go on).
_EXCEPTION_LINE = re.compile(r"((?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*): ")


def one_line(e: BaseException) -> str:
    """``e``'s own message on one line: a Ray wrapper's cause's text (the wrapper's text is the remote traceback),
    and a message of several lines (a server's stderr tail) joined by spaces."""
    cause = getattr(e, "cause", None)
    text = str(cause if isinstance(cause, BaseException) else e)
    return " ".join(line.strip() for line in text.splitlines() if line.strip()) or type(e).__name__


def user_error_of(e: BaseException) -> UserInputError | None:
    """The ``UserInputError`` that ``e`` is or carries, or None.

    Ray raises an actor method's error as a ``RayTaskError`` that is also an instance of the error's class, with the
    error in ``cause`` (when the class cannot be subclassed, only in ``cause``). An actor whose constructor raised
    (a worker loading a bad ``model.path``, a LoRA adapter of the wrong rank, vLLM not installed) answers every call
    with an ``ActorDiedError`` that keeps only the text of the creation task's traceback: the error is rebuilt from
    the traceback's exception line (``asyncrl.config.errors.ConfigError: ...``) when that names a
    ``UserInputError`` class.
    """
    if isinstance(e, UserInputError):
        return e
    cause = getattr(e, "cause", None)
    if isinstance(cause, UserInputError):
        return cause
    if getattr(e, "actor_init_failed", False):
        return _from_traceback_text(str(getattr(e, "error_msg", "") or e))
    return None


def _from_traceback_text(text: str) -> UserInputError | None:
    """The error a formatted traceback ends with, rebuilt from its class path and message, if it is an asyncrl
    ``UserInputError``: the first line at column 0 after the last frame (``  File ...`` and its indented source
    lines) starts it, and the message runs to the end (it may have lines of its own)."""
    lines = text.splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    start = frames[-1] + 1 if frames else 0
    while start < len(lines) and (not lines[start] or lines[start][0].isspace()):
        start += 1
    match = _EXCEPTION_LINE.match(lines[start]) if start < len(lines) else None
    if match is None:
        return None
    module, _, name = match.group(1).rpartition(".")
    if not module.startswith("asyncrl."):
        return None
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    if not (isinstance(cls, type) and issubclass(cls, UserInputError)):
        return None
    message = "\n".join([lines[start][match.end() :], *lines[start + 1 :]]).strip()
    try:
        return cls(message)
    except TypeError:  # a constructor that needs more than the message: keep Ray's error as it is
        return None


def raise_if_user_error(e: BaseException) -> None:
    """Raise the ``UserInputError`` that ``e`` is or carries (``user_error_of``), from ``e``; else return."""
    error = user_error_of(e)
    if error is not None:
        raise error from e


@contextmanager
def user_errors_unwrapped() -> Iterator[None]:
    """Re-raise a ``UserInputError`` that reached here wrapped by Ray (``user_error_of``) as itself, so one
    ``except UserInputError`` handles it whichever backend ran the worker; anything else passes unchanged."""
    try:
        yield
    except UserInputError:
        raise
    except Exception as e:
        raise_if_user_error(e)
        raise
