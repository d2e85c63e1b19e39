package io.bergstream.backfill;

import org.apache.spark.sql.connector.read.InputPartition;

/** One partition of a {@code bergstream-hybrid} micro-batch: an archive epoch's or Kafka's own, wrapped. */
final class HybridPartition implements InputPartition {
  private static final long serialVersionUID = 1L;

  final InputPartition inner;
  // Whether `inner` is Kafka's offset range; otherwise it is an EpochPartition of the archive.
  final boolean fromKafka;

  private HybridPartition(InputPartition inner, boolean fromKafka) {
    this.inner = inner;
    this.fromKafka = fromKafka;
  }

  static HybridPartition archive(InputPartition epoch) {
    return new HybridPartition(epoch, false);
  }

  static HybridPartition kafka(InputPartition range) {
    return new HybridPartition(range, true);
  }

  @Override
  public String[] preferredLocations() {
    return inner.preferredLocations();
  }
}
