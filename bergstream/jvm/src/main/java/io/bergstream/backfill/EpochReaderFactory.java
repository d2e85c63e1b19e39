package io.bergstream.backfill;

import java.io.IOException;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.metric.CustomTaskMetric;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.unsafe.types.UTF8String;

/** Iceberg's row readers, keeping only each partition's rows of its epoch (and of the plan's regions). */
final class EpochReaderFactory implements PartitionReaderFactory {
  private static final long serialVersionUID = 1L;

  private final PartitionReaderFactory iceberg;
  private final RowLayout layout;
  private final String[] regions;  // null: every region

  EpochReaderFactory(PartitionReaderFactory iceberg, RowLayout layout, List<String> regions) {
    this.iceberg = iceberg;
    this.layout = layout;
    this.regions = regions == null ? null : regions.toArray(new String[0]);
  }

  @Override
  public PartitionReader<InternalRow> createReader(InputPartition partition) {
    EpochPartition epoch = (EpochPartition) partition;
    if (iceberg.supportColumnarReads(epoch.iceberg)) {
      throw new IllegalStateException("bergstream-backfill reads rows, but Iceberg planned a columnar read");
    }
    Set<UTF8String> wanted = null;
    if (regions != null) {
      wanted = new HashSet<>();
      for (String region : regions) {
        wanted.add(UTF8String.fromString(region));
      }
    }
    return new EpochReader(iceberg.createReader(epoch.iceberg), layout, epoch.lo, epoch.hi, wanted);
  }

  @Override
  public boolean supportColumnarReads(InputPartition partition) {
    return false;
  }

  private static final class EpochReader implements PartitionReader<InternalRow> {
    private final PartitionReader<InternalRow> iceberg;
    private final RowLayout layout;
    private final long lo;
    private final long hi;
    private final Set<UTF8String> regions;

    EpochReader(PartitionReader<InternalRow> iceberg, RowLayout layout, long lo, long hi, Set<UTF8String> regions) {
      this.iceberg = iceberg;
      this.layout = layout;
      this.lo = lo;
      this.hi = hi;
      this.regions = regions;
    }

    @Override
    public boolean next() throws IOException {
      while (iceberg.next()) {
        if (layout.selects(iceberg.get(), lo, hi, regions)) {
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
