"""The router: a Spark Structured Streaming query per set of topics (one topic, the topics named, or every
topic a pattern matches), one writer for all of them, archiving each topic into its Iceberg tables."""
