package io.bergstream.backfill;

import java.util.List;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.spark.source.SparkTable;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.connector.catalog.CatalogManager;
import org.apache.spark.sql.connector.catalog.CatalogPlugin;
import org.apache.spark.sql.connector.catalog.CatalogV2Util;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCatalog;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The plan's archive table, loaded through the session's catalogs and pinned to one snapshot, so that
 * every micro-batch of the stream (and every restart with the same plan) reads the same data.
 */
final class ArchiveTable {
  static final String METADATA = "__metadata__";
  static final String INGESTION_TS = "kafka_ingestion_ts";
  static final String CLUSTER = "cluster";

  final SparkTable iceberg;
  final Long snapshotId;  // null only for a table without any snapshot: nothing to read
  final DataType ingestionTsType;

  private ArchiveTable(SparkTable iceberg, Long snapshotId, DataType ingestionTsType) {
    this.iceberg = iceberg;
    this.snapshotId = snapshotId;
    this.ingestionTsType = ingestionTsType;
  }

  /** The table's columns at the pinned snapshot, as Spark types. */
  StructType schema() {
    return CatalogV2Util.v2ColumnsToStructType(iceberg.columns());
  }

  static ArchiveTable load(Plan plan) {
    SparkSession spark = SparkSession.active();
    List<String> names;
    try {
      names = CollectionConverters.asJava(spark.sessionState().sqlParser().parseMultipartIdentifier(plan.table));
    } catch (Exception e) {
      throw refused(plan, "is not a table name: " + e.getMessage(), e);
    }
    CatalogManager catalogs = spark.sessionState().catalogManager();
    String first = names.get(0);
    boolean named = names.size() > 2
        || (names.size() == 2 && (catalogs.isCatalogRegistered(first)
            || first.equalsIgnoreCase(CatalogManager.SESSION_CATALOG_NAME())));
    CatalogPlugin plugin;
    try {
      plugin = named ? catalogs.catalog(first) : catalogs.currentCatalog();
    } catch (RuntimeException e) {
      throw refused(plan, "names catalog " + first + ", which this Spark session does not have", e);
    }
    if (!(plugin instanceof TableCatalog catalog)) {
      throw refused(plan, "is in catalog " + plugin.name() + ", which holds no tables", null);
    }
    List<String> path = named ? names.subList(1, names.size()) : names;
    Identifier identifier = Identifier.of(
        path.subList(0, path.size() - 1).toArray(new String[0]), path.get(path.size() - 1));

    SparkTable current = icebergTable(plan, load(plan, catalog, identifier, null));
    Long snapshotId = plan.snapshotId;
    if (snapshotId == null) {
      Snapshot snapshot = current.table().currentSnapshot();
      snapshotId = snapshot == null ? null : snapshot.snapshotId();
    } else if (current.table().snapshot(snapshotId) == null) {
      throw refused(plan, "has no snapshot " + snapshotId
          + " any more (expired by table maintenance?): plan the backfill again", null);
    }
    SparkTable pinned = snapshotId == null
        ? current
        : icebergTable(plan, load(plan, catalog, identifier, Long.toString(snapshotId)));
    StructType schema = CatalogV2Util.v2ColumnsToStructType(pinned.columns());
    return new ArchiveTable(pinned, snapshotId, ingestionTsType(plan, schema));
  }

  private static Table load(Plan plan, TableCatalog catalog, Identifier identifier, String version) {
    try {
      return version == null ? catalog.loadTable(identifier) : catalog.loadTable(identifier, version);
    } catch (NoSuchTableException e) {
      throw refused(plan, "was not found in catalog " + catalog.name(), e);
    } catch (RuntimeException e) {
      String at = version == null ? "" : " at snapshot " + version;
      throw refused(plan, "could not be loaded" + at + ": " + e.getMessage(), e);
    }
  }

  private static SparkTable icebergTable(Plan plan, Table table) {
    if (!(table instanceof SparkTable iceberg)) {
      throw refused(plan, "is not an Iceberg table (" + table.getClass().getName() + ")", null);
    }
    return iceberg;
  }

  /** The type of __metadata__.kafka_ingestion_ts, after checking that the table has what the epochs need. */
  private static DataType ingestionTsType(Plan plan, StructType schema) {
    StructField metadata = field(schema, METADATA);
    StructField ts = metadata != null && metadata.dataType() instanceof StructType struct
        ? field(struct, INGESTION_TS) : null;
    if (ts == null || !(ts.dataType().equals(DataTypes.TimestampType)
        || ts.dataType().equals(DataTypes.TimestampNTZType))) {
      throw refused(plan, "has no timestamp column " + METADATA + "." + INGESTION_TS
          + ": it is not a bergstream archive table", null);
    }
    if (plan.regions != null) {
      StructField cluster = field((StructType) metadata.dataType(), CLUSTER);
      if (cluster == null || !cluster.dataType().equals(DataTypes.StringType)) {
        throw refused(plan, "has no string column " + METADATA + "." + CLUSTER
            + " to select the plan's regions " + plan.regions + " by", null);
      }
    }
    return ts.dataType();
  }

  static StructField field(StructType struct, String name) {
    for (StructField field : struct.fields()) {
      if (field.name().equals(name)) {
        return field;
      }
    }
    return null;
  }

  static int index(StructType struct, String name) {
    StructField[] fields = struct.fields();
    for (int i = 0; i < fields.length; i++) {
      if (fields[i].name().equals(name)) {
        return i;
      }
    }
    return -1;
  }

  private static IllegalArgumentException refused(Plan plan, String why, Throwable cause) {
    return new IllegalArgumentException(
        "bergstream-backfill: table " + plan.table + " of plan file " + plan.path + " " + why, cause);
  }
}
