package io.bergstream.backfill;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.connector.catalog.CatalogPlugin;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableCatalog;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code spark.readStream.format("bergstream-backfill").option("plan", file)}: an archive table read
 * epoch by epoch, one epoch per micro-batch, each epoch's rows through Iceberg's own Spark reader.
 */
public final class BackfillSource implements TableProvider, DataSourceRegister {

  @Override
  public String shortName() {
    return "bergstream-backfill";
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    Plan plan = Plan.read(options.get("plan"));
    return icebergTable(plan).schema();
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    Plan plan = Plan.read(properties.get("plan"));
    return new BackfillTable(plan, icebergTable(plan), schema);
  }

  /** The archive table at the plan's snapshot, as Spark's catalog for it loads it. */
  static SupportsRead icebergTable(Plan plan) {
    String[] parts = plan.table.split("\\.");
    if (parts.length != 3) {
      throw new IllegalArgumentException(
          "backfill plan " + plan.path + ": table " + plan.table + " is not catalog.namespace.table");
    }
    CatalogPlugin plugin = SparkSession.active().sessionState().catalogManager().catalog(parts[0]);
    if (!(plugin instanceof TableCatalog catalog)) {
      throw new IllegalArgumentException("catalog " + parts[0] + " of " + plan.table + " has no tables");
    }
    Identifier identifier = Identifier.of(new String[] {parts[1]}, parts[2]);
    Table table;
    try {
      table = plan.snapshotId == null
          ? catalog.loadTable(identifier)
          : catalog.loadTable(identifier, Long.toString(plan.snapshotId));
    } catch (NoSuchTableException e) {
      throw new IllegalArgumentException(
          "backfill plan " + plan.path + ": table " + plan.table + " does not exist", e);
    } catch (RuntimeException e) {
      throw new IllegalArgumentException(
          "backfill plan " + plan.path + ": cannot load " + plan.table + " at snapshot "
              + plan.snapshotId + " (expired by maintenance?): " + e.getMessage(), e);
    }
    if (!(table instanceof SupportsRead readable)) {
      throw new IllegalArgumentException("table " + plan.table + " cannot be read by Spark");
    }
    Rows.locate(table.schema(), plan);
    return readable;
  }

  @Override
  public boolean supportsExternalMetadata() {
    return false;
  }

  /** The archive table as a streaming source of epochs. */
  static final class BackfillTable implements SupportsRead {
    private final Plan plan;
    private final SupportsRead iceberg;
    private final StructType schema;

    BackfillTable(Plan plan, SupportsRead iceberg, StructType schema) {
      this.plan = plan;
      this.iceberg = iceberg;
      this.schema = schema;
    }

    @Override
    public String name() {
      return "bergstream-backfill[" + plan.source + ": " + plan.table + "]";
    }

    @Override
    public StructType schema() {
      return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.MICRO_BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return () -> new Scan() {
        @Override
        public StructType readSchema() {
          return schema;
        }

        @Override
        public String description() {
          return name();
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
          return new EpochStream(plan, iceberg, schema);
        }
      };
    }
  }
}
