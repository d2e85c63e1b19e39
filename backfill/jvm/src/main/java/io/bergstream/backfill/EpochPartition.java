package io.bergstream.backfill;

import org.apache.spark.sql.connector.read.InputPartition;

/** One of Iceberg's input partitions, read for one epoch [lower, upper) of ingestion time. */
final class EpochPartition implements InputPartition {
  private static final long serialVersionUID = 1L;

  final InputPartition iceberg;
  final long lower;
  final long upper;

  EpochPartition(InputPartition iceberg, long lower, long upper) {
    this.iceberg = iceberg;
    this.lower = lower;
    this.upper = upper;
  }

  @Override
  public String[] preferredLocations() {
    return iceberg.preferredLocations();
  }
}
