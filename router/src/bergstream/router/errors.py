"""Errors of the router that end its query."""

from __future__ import annotations

from bergstream.errors import BergstreamError


class RouterStopped(BergstreamError):
    """The streaming query failed; the message carries Spark's reason."""
