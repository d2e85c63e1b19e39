"""Errors that bergstream reports to its user as one line, without a traceback, and the check that a program
it needs is installed."""

import shutil


class BergstreamError(Exception):
    """A problem the user can fix; the message says what is wrong and what to do."""


class ConfigError(BergstreamError):
    """Configuration that is refused at start."""


class MissingToolError(BergstreamError):
    """A program bergstream needs (java, mvn) is not installed."""


class StackError(BergstreamError):
    """The embedded local stack cannot be started, stopped or found."""


def first_line(error: BaseException) -> str:
    """The first line of an error's text; its type when it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def require_tool(name: str, purpose: str) -> str:
    """The path of the program `name` on PATH; MissingToolError, saying what it is needed for, when absent."""
    path = shutil.which(name)
    if path is None:
        raise MissingToolError(
            f"'{name}' was not found on PATH; it is needed to {purpose}. Install it and retry."
        )
    return path
