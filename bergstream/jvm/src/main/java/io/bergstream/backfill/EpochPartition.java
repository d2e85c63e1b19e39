package io.bergstream.backfill;

import org.apache.spark.sql.connector.read.InputPartition;

/** One of Iceberg's input partitions, read for the epoch [lo, hi) of ingestion time only. */
final class EpochPartition implements InputPartition {
  private static final long serialVersionUID = 1L;

  final InputPartition iceberg;
  final int epoch;
  final long lo;
  final long hi;

  EpochPartition(InputPartition iceberg, int epoch, long lo, long hi) {
    this.iceberg = iceberg;
    this.epoch = epoch;
    this.lo = lo;
    this.hi = hi;
  }

  @Override
  public String[] preferredLocations() {
    return iceberg.preferredLocations();
  }
}
