"""Errors that bergstream reports to its user as one line, without a traceback."""


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
