package io.bergstream.backfill;

import java.util.Map;
import org.apache.spark.sql.connector.metric.CustomMetric;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The scan of every epoch. It keeps one unfiltered Iceberg scan of the pinned snapshot (built, never
 * planned) to learn the schema of the rows Iceberg's reader returns and the task metrics it reports.
 */
final class BackfillScan implements Scan {
  /** Rows, not columnar batches: the epoch filter works on rows (Iceberg reads nested types as rows). */
  static final CaseInsensitiveStringMap ICEBERG_READ_OPTIONS =
      new CaseInsensitiveStringMap(Map.of("vectorization-enabled", "false"));

  private final Plan plan;
  private final ArchiveTable archive;
  private final Scan template;

  BackfillScan(Plan plan, ArchiveTable archive) {
    this.plan = plan;
    this.archive = archive;
    this.template = archive.iceberg.newScanBuilder(ICEBERG_READ_OPTIONS).build();
    // The stream hands Iceberg's rows to Spark as they are: they must have the table's columns.
    StructType rows = template.readSchema();
    if (!rows.catalogString().equals(archive.schema().catalogString())) {
      throw new IllegalStateException("bergstream-backfill: Iceberg reads table " + plan.table + " as "
          + rows.catalogString() + ", not as its schema " + archive.schema().catalogString());
    }
  }

  @Override
  public StructType readSchema() {
    return archive.schema();
  }

  @Override
  public String description() {
    return "bergstream-backfill[" + plan.source + ": " + plan.table + "@" + archive.snapshotId + "]";
  }

  @Override
  public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
    return new EpochStream(plan, archive, RowLayout.of(template.readSchema(), plan.regions != null));
  }

  @Override
  public CustomMetric[] supportedCustomMetrics() {
    return template.supportedCustomMetrics();
  }

  /** Each partition is one Iceberg task read as rows. */
  @Override
  public ColumnarSupportMode columnarSupportMode() {
    return ColumnarSupportMode.UNSUPPORTED;
  }
}
