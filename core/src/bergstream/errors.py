"""Errors that bergstream reports to its user as one line, without a traceback."""


class BergstreamError(Exception):
    """A problem the user can fix; the message says what is wrong and what to do."""


class ConfigError(BergstreamError):
    """Configuration that is refused at start."""


class MissingToolError(BergstreamError):
    """A program bergstream needs (java, mvn) is not installed."""


class StackError(BergstreamError):
    """The embedded local stack cannot be started, stopped or found."""
