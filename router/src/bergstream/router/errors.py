"""Errors of the router that end its query."""

from __future__ import annotations

from bergstream.errors import BergstreamError


class RouterStopped(BergstreamError):
    """The streaming query failed; the message carries Spark's reason."""


class StopRequested(RouterStopped):
    """The router was asked to stop while a batch waited for its tables: the batch is not committed, and Spark
    runs it again when the router starts again."""


class SecondWriter(BergstreamError):
    """Another router writes the same topic into the same table: the later one stops, before it archives
    a record twice."""


class KafkaUnavailable(BergstreamError):
    """Kafka cannot be read now (its brokers out, a timeout): the ranges being read stay where they were
    (unread, or the batch's, which Spark runs again); none is set aside as a topic's failure."""
