"""Synthetic Kafka records for load tests: realistic events and the malformed ones real producers send."""
