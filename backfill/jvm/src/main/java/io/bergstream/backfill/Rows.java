package io.bergstream.backfill;

import java.io.Serializable;
import java.util.HashSet;
import java.util.Set;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/** Where the ingestion time and the cluster sit in an archive row, and the epoch's one filter. */
final class Rows implements Serializable {
  private static final long serialVersionUID = 1L;
  static final String METADATA = "__metadata__";
  static final String INGESTION_TS = "kafka_ingestion_ts";
  static final String CLUSTER = "cluster";

  final int metadata;
  final int metadataFields;
  final int ingestionTs;
  final int cluster;

  private Rows(int metadata, int metadataFields, int ingestionTs, int cluster) {
    this.metadata = metadata;
    this.metadataFields = metadataFields;
    this.ingestionTs = ingestionTs;
    this.cluster = cluster;
  }

  static Rows locate(StructType schema, Plan plan) {
    int metadata = index(schema, METADATA);
    DataType type = metadata < 0 ? null : schema.fields()[metadata].dataType();
    if (!(type instanceof StructType struct)) {
      throw new IllegalArgumentException(
          "table " + plan.table + " has no " + METADATA + " struct: it is not an archive table");
    }
    int ts = index(struct, INGESTION_TS);
    if (ts < 0 || !struct.fields()[ts].dataType().equals(DataTypes.TimestampType)) {
      throw new IllegalArgumentException(
          "table " + plan.table + " has no timestamp " + METADATA + "." + INGESTION_TS);
    }
    int cluster = index(struct, CLUSTER);
    if (plan.regions != null && cluster < 0) {
      throw new IllegalArgumentException(
          "table " + plan.table + " has no " + METADATA + "." + CLUSTER + " to select regions by");
    }
    return new Rows(metadata, struct.fields().length, ts, cluster);
  }

  private static int index(StructType struct, String name) {
    StructField[] fields = struct.fields();
    for (int i = 0; i < fields.length; i++) {
      if (fields[i].name().equals(name)) {
        return i;
      }
    }
    return -1;
  }

  static Set<UTF8String> regions(Plan plan) {
    if (plan.regions == null) {
      return null;
    }
    Set<UTF8String> wanted = new HashSet<>();
    for (String region : plan.regions) {
      wanted.add(UTF8String.fromString(region));
    }
    return wanted;
  }

  long ingestionTime(InternalRow row) {
    return row.getStruct(metadata, metadataFields).getLong(ingestionTs);
  }

  /** Whether the row belongs to the epoch [lower, upper) and, when regions are given, to one of them. */
  boolean selected(InternalRow row, long lower, long upper, Set<UTF8String> regions) {
    if (row.isNullAt(metadata)) {
      return false;
    }
    InternalRow meta = row.getStruct(metadata, metadataFields);
    if (meta.isNullAt(ingestionTs)) {
      return false;
    }
    long ts = meta.getLong(ingestionTs);
    if (ts < lower || ts >= upper) {
      return false;
    }
    return regions == null || (!meta.isNullAt(cluster) && regions.contains(meta.getUTF8String(cluster)));
  }
}
