package io.bergstream.backfill;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.Iterator;
import java.util.List;
import java.util.Set;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.connector.metric.CustomTaskMetric;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/** The readers of an epoch's units, keeping only the rows of the epoch (and regions). */
final class EpochReaderFactory implements PartitionReaderFactory {
  private static final long serialVersionUID = 1L;

  private final PartitionReaderFactory iceberg;
  private final StructType schema;
  private final Rows rows;
  private final Set<UTF8String> regions;

  EpochReaderFactory(
      PartitionReaderFactory iceberg, StructType schema, Rows rows, Set<UTF8String> regions) {
    this.iceberg = iceberg;
    this.schema = schema;
    this.rows = rows;
    this.regions = regions;
  }

  @Override
  public PartitionReader<InternalRow> createReader(InputPartition partition) {
    EpochPartition epoch = (EpochPartition) partition;
    if (!epoch.merged) {
      return new EpochReader(split(epoch, 0), rows, epoch.lower, epoch.upper, regions);
    }
    return new MergedReader(epoch);
  }

  /** Unit `i` of the epoch, by Spark's Parquet reader where it has slices, else by Iceberg's. */
  private PartitionReader<InternalRow> split(EpochPartition epoch, int i) {
    ParquetFiles.Slice[] slices = epoch.slices[i];
    return slices != null ? epoch.parquet.open(slices) : iceberg.createReader(epoch.iceberg[i]);
  }

  /**
   * All of an epoch's rows of one table, sorted by ingestion time, in the task's memory: what bounds it
   * is the width of a strict epoch (order.py's STRICT_EPOCH).
   */
  private final class MergedReader implements PartitionReader<InternalRow> {
    private final Iterator<InternalRow> sorted;
    private InternalRow current;

    MergedReader(EpochPartition epoch) {
      List<InternalRow> all = new ArrayList<>();
      UnsafeProjection copy = UnsafeProjection.create(schema);
      for (int i = 0; i < epoch.units(); i++) {
        try (PartitionReader<InternalRow> reader =
            new EpochReader(split(epoch, i), rows, epoch.lower, epoch.upper, regions)) {
          while (reader.next()) {
            all.add(copy.apply(reader.get()).copy());  // readers reuse their row
          }
        } catch (IOException e) {
          throw new UncheckedIOException(e);
        }
      }
      all.sort(Comparator.comparingLong(rows::ingestionTime));
      this.sorted = all.iterator();
    }

    @Override
    public boolean next() {
      current = sorted.hasNext() ? sorted.next() : null;
      return current != null;
    }

    @Override
    public InternalRow get() {
      return current;
    }

    @Override
    public void close() {}
  }

  @Override
  public boolean supportColumnarReads(InputPartition partition) {
    return false;
  }

  private static final class EpochReader implements PartitionReader<InternalRow> {
    private final PartitionReader<InternalRow> iceberg;
    private final Rows rows;
    private final long lower;
    private final long upper;
    private final Set<UTF8String> regions;

    EpochReader(PartitionReader<InternalRow> iceberg, Rows rows, long lower, long upper, Set<UTF8String> regions) {
      this.iceberg = iceberg;
      this.rows = rows;
      this.lower = lower;
      this.upper = upper;
      this.regions = regions;
    }

    @Override
    public boolean next() throws IOException {
      while (iceberg.next()) {
        if (rows.selected(iceberg.get(), lower, upper, regions)) {
          return true;
        }
      }
      return false;
    }

    @Override
    public InternalRow get() {
      return iceberg.get();
    }

    @Override
    public CustomTaskMetric[] currentMetricsValues() {
      return iceberg.currentMetricsValues();
    }

    @Override
    public void close() throws IOException {
      iceberg.close();
    }
  }
}
