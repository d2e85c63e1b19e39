package io.bergstream.backfill;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code spark.readStream.format("bergstream-backfill").option("plan", file).load()}: an archive table
 * read epoch by epoch of ingestion time, one epoch per micro-batch, each epoch through Iceberg's own
 * Spark reader. The schema is the table's at the plan's snapshot.
 */
public final class BackfillSource implements TableProvider, DataSourceRegister {
  static final String PLAN_OPTION = "plan";

  @Override
  public String shortName() {
    return "bergstream-backfill";
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return ArchiveTable.load(Plan.read(options.get(PLAN_OPTION))).schema();
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    Plan plan = Plan.read(new CaseInsensitiveStringMap(properties).get(PLAN_OPTION));
    return new BackfillTable(plan, ArchiveTable.load(plan));
  }

  /** The table's schema is the archive's: a schema given by the reader could only disagree with it. */
  @Override
  public boolean supportsExternalMetadata() {
    return false;
  }

  /** The archive table as a stream of epochs; it can only be read as micro-batches. */
  static final class BackfillTable implements SupportsRead {
    private final Plan plan;
    private final ArchiveTable archive;

    BackfillTable(Plan plan, ArchiveTable archive) {
      this.plan = plan;
      this.archive = archive;
    }

    @Override
    public String name() {
      return "bergstream-backfill[" + plan.table + "@" + archive.snapshotId + "]";
    }

    @Override
    public Column[] columns() {
      return archive.iceberg.columns();
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.MICRO_BATCH_READ);
    }

    /**
     * Spark builds micro-batch scans without pushing anything down (MicroBatchExecution: "TODO: operator
     * pushdown"), so the scan is always the whole row; Spark prunes columns after it.
     */
    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return () -> new BackfillScan(plan, archive);
    }
  }
}
