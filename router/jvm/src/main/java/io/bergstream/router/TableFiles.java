package io.bergstream.router;

import java.util.Map;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableProperties;
import org.apache.iceberg.data.RegistryBasedFileWriterFactory;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.StructType;

/**
 * A table's data files from Spark's internal rows of its columns, as Spark's Iceberg writer makes them: the
 * format the table names (Parquet unless {@code write.format.default} says otherwise), its properties
 * (compression, row groups, dictionary, bloom filters), its metrics config, its schema as evolved and its
 * sort order, through the file writers Iceberg registers for Spark's rows.
 */
final class TableFiles extends RegistryBasedFileWriterFactory<InternalRow, StructType> {
  private static final long serialVersionUID = 1L;

  TableFiles(Table table, StructType type) {
    super(table, format(table), InternalRow.class, table.schema(), table.sortOrder(), format(table), null, null,
        null, Map.of(), type, null);
  }

  /** The format the table's data files are written in. */
  static FileFormat format(Table table) {
    return FileFormat.fromString(
        table.properties().getOrDefault(
            TableProperties.DEFAULT_FILE_FORMAT, TableProperties.DEFAULT_FILE_FORMAT_DEFAULT));
  }
}
