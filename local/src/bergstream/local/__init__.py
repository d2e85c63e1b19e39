"""The embedded local stack: one Kafka broker, a SQLite Iceberg catalog and a warehouse folder."""

from bergstream.local.stack import LocalStack
from bergstream.local.stack_config import StackConfig, StackStatus

__all__ = ["LocalStack", "StackConfig", "StackStatus"]
