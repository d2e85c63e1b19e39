package io.bergstream.backfill;

import java.io.Serializable;
import java.util.Set;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Where a row from Iceberg's reader keeps its ingestion time and cluster, and the test that keeps a row
 * in its epoch: Iceberg only skips files and row groups, so rows outside the epoch still arrive.
 */
final class RowLayout implements Serializable {
  private static final long serialVersionUID = 1L;

  private final int metadata;
  private final int metadataFields;
  private final int ingestionTs;
  private final int cluster;  // -1 when there are no regions to test

  private RowLayout(int metadata, int metadataFields, int ingestionTs, int cluster) {
    this.metadata = metadata;
    this.metadataFields = metadataFields;
    this.ingestionTs = ingestionTs;
    this.cluster = cluster;
  }

  /** The layout of `rows`, which ArchiveTable has checked to hold the metadata the epochs need. */
  static RowLayout of(StructType rows, boolean regions) {
    int metadata = ArchiveTable.index(rows, ArchiveTable.METADATA);
    StructType struct = (StructType) rows.fields()[metadata].dataType();
    return new RowLayout(
        metadata,
        struct.fields().length,
        ArchiveTable.index(struct, ArchiveTable.INGESTION_TS),
        regions ? ArchiveTable.index(struct, ArchiveTable.CLUSTER) : -1);
  }

  /** Whether the row was ingested in [lo, hi) and, when regions are given, in one of them. */
  boolean selects(InternalRow row, long lo, long hi, Set<UTF8String> regions) {
    if (row.isNullAt(metadata)) {
      return false;
    }
    InternalRow meta = row.getStruct(metadata, metadataFields);
    if (meta.isNullAt(ingestionTs)) {
      return false;
    }
    long ts = meta.getLong(ingestionTs);
    if (ts < lo || ts >= hi) {
      return false;
    }
    return regions == null || (!meta.isNullAt(cluster) && regions.contains(meta.getUTF8String(cluster)));
  }
}
