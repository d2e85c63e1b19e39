package io.bergstream.backfill;

import org.apache.spark.sql.connector.read.streaming.ReadLimit;

/**
 * The source's own pace, as its default read limit: one epoch per micro-batch. No row, file or byte
 * limit says that, and Spark only hands the default limit back to the source.
 */
final class OneEpochPerBatch implements ReadLimit {
  static final OneEpochPerBatch INSTANCE = new OneEpochPerBatch();

  private OneEpochPerBatch() {}

  @Override
  public String toString() {
    return "one epoch per micro-batch";
  }
}
