package io.bergstream.backfill;

import java.util.Arrays;
import java.util.LinkedHashSet;
import java.util.Set;
import org.apache.spark.sql.connector.read.InputPartition;

/**
 * Iceberg's input partitions read for one epoch [lower, upper) of ingestion time: one, read as it
 * comes, or all of an epoch's, merged by one reader into exact ingestion-time order.
 */
final class EpochPartition implements InputPartition {
  private static final long serialVersionUID = 1L;

  final InputPartition[] iceberg;
  final long lower;
  final long upper;
  // Sorted by ingestion time, also when the epoch has one split: rows are in no order inside a file.
  final boolean merged;
  // Per split of `iceberg`: its file slices where Spark's Parquet reader reads them, else null.
  final ParquetFiles.Slice[][] slices;

  EpochPartition(
      InputPartition[] iceberg, ParquetFiles.Slice[][] slices, long lower, long upper, boolean merged) {
    this.iceberg = iceberg;
    this.slices = slices;
    this.lower = lower;
    this.upper = upper;
    this.merged = merged;
  }

  @Override
  public String[] preferredLocations() {
    Set<String> hosts = new LinkedHashSet<>();
    for (InputPartition partition : iceberg) {
      hosts.addAll(Arrays.asList(partition.preferredLocations()));
    }
    return hosts.toArray(new String[0]);
  }
}
