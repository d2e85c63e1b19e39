"""The router: one Spark job per topic that archives the topic into its Iceberg table."""
