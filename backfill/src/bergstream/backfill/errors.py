"""Errors of the backfill, each naming the table, file or setting involved."""

from bergstream.errors import BergstreamError, ConfigError


class PlanError(BergstreamError):
    """The archive cannot be planned as asked: a table is missing, has no usable bounds, has deletes."""


class BackfillConfigError(ConfigError):
    """Backfill settings that are refused at start."""


class CheckpointMismatch(BergstreamError):
    """A checkpoint made for another backfill (other tables, window or bound) was given to this one."""


class BackfillError(BergstreamError):
    """A backfill or an application run that failed; the message says where and why."""
