package io.bergstream.backfill;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * What one task reads of one epoch [lower, upper) of ingestion time: units, each either Iceberg's input
 * partition or file slices for Spark's Parquet reader. Read as they come, or all merged by one reader
 * into exact ingestion-time order.
 */
final class EpochPartition implements InputPartition {
  private static final long serialVersionUID = 1L;

  // Per unit: Iceberg's split, read by Iceberg's reader, or null where `slices` holds the unit.
  final InputPartition[] iceberg;
  // Per unit: file slices read by `parquet`, or null.
  final ParquetFiles.Slice[][] slices;
  // Spark's Parquet reader of this epoch, or null when no unit is read by it.
  final ParquetFiles.Reader parquet;
  final long lower;
  final long upper;
  // Sorted by ingestion time, also when the epoch has one unit: rows are in no order inside a file.
  final boolean merged;
  private final String[] hosts;

  EpochPartition(
      InputPartition[] iceberg,
      ParquetFiles.Slice[][] slices,
      ParquetFiles.Reader parquet,
      String[] hosts,
      long lower,
      long upper,
      boolean merged) {
    this.iceberg = iceberg;
    this.slices = slices;
    this.parquet = parquet;
    this.hosts = hosts;
    this.lower = lower;
    this.upper = upper;
    this.merged = merged;
  }

  int units() {
    return iceberg.length;
  }

  @Override
  public String[] preferredLocations() {
    return hosts;
  }
}
