package io.bergstream.router;

import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.Schema;
import org.apache.iceberg.SortOrder;
import org.apache.iceberg.StructLike;
import org.apache.iceberg.Table;
import org.apache.iceberg.deletes.EqualityDeleteWriter;
import org.apache.iceberg.deletes.PositionDeleteWriter;
import org.apache.iceberg.encryption.EncryptedOutputFile;
import org.apache.iceberg.io.DataWriter;
import org.apache.iceberg.io.FileWriterFactory;
import org.apache.iceberg.parquet.Parquet;
import org.apache.iceberg.spark.data.SparkParquetWriters;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.StructType;

/** Iceberg's Parquet data files of a table, from Spark's internal rows of its columns. */
final class ParquetRows implements FileWriterFactory<InternalRow>, Serializable {
  private static final long serialVersionUID = 1L;
  private final Table table;
  private final StructType type;

  ParquetRows(Table table, StructType type) {
    this.table = table;
    this.type = type;
  }

  @Override
  public DataWriter<InternalRow> newDataWriter(
      EncryptedOutputFile file, PartitionSpec spec, StructLike partition) {
    Schema schema = table.schema();
    SortOrder order = table.sortOrder();
    try {
      return Parquet.writeData(file)
          .forTable(table)
          .schema(schema)
          .withSpec(spec)
          .withPartition(partition)
          .withSortOrder(order)
          .createWriterFunc(message -> SparkParquetWriters.buildWriter(type, message))
          .overwrite()
          .build();
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
  }

  @Override
  public EqualityDeleteWriter<InternalRow> newEqualityDeleteWriter(
      EncryptedOutputFile file, PartitionSpec spec, StructLike partition) {
    throw new UnsupportedOperationException("the archive is appended to, never deleted from");
  }

  @Override
  public PositionDeleteWriter<InternalRow> newPositionDeleteWriter(
      EncryptedOutputFile file, PartitionSpec spec, StructLike partition) {
    throw new UnsupportedOperationException("the archive is appended to, never deleted from");
  }
}
