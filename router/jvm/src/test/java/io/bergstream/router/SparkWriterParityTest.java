package io.bergstream.router;

import static io.bergstream.router.TopicWriterTest.HOUR_MICROS;
import static io.bergstream.router.TopicWriterTest.RECORDS;
import static io.bergstream.router.TopicWriterTest.START_MICROS;
import static io.bergstream.router.TopicWriterTest.append;
import static io.bergstream.router.TopicWriterTest.combined;
import static io.bergstream.router.TopicWriterTest.record;
import static io.bergstream.router.TopicWriterTest.spark;
import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.lit;
import static org.apache.spark.sql.functions.when;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.FileScanTask;
import org.apache.iceberg.Table;
import org.apache.iceberg.expressions.Expressions;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.spark.Spark3Util;
import org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.parquet.hadoop.metadata.BlockMetaData;
import org.apache.parquet.hadoop.metadata.ColumnChunkMetaData;
import org.apache.parquet.hadoop.metadata.ParquetMetadata;
import org.apache.parquet.hadoop.util.HadoopInputFile;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/**
 * The one writer's files against Spark's Iceberg writer's, for the same rows into tables made alike: a schema
 * evolved since the table was made (its columns' ids are not their positions), a format version, a file
 * format, a compression codec, a metrics config, a write location and a partition spec of the table's own. The files must
 * agree in where they are, their format, their schema, their codec, their metrics, their sort order and
 * their rows, file by file and in order.
 */
class SparkWriterParityTest {
  @BeforeAll
  static void session() throws Exception {
    TopicWriterTest.session();
  }

  @AfterAll
  static void stop() throws Exception {
    TopicWriterTest.stop();
  }

  static final String METADATA =
      "struct<kafka_ingestion_ts: timestamp, topic: string, partition: int, offset: bigint,"
          + " router_write_ts: timestamp>";

  /** An archive table as bergstream makes it, its schema evolved and its properties set, in t.ns. */
  static void createArchive(String name, String format) throws Exception {
    String table = "t.ns." + name;
    spark.sql("CREATE NAMESPACE IF NOT EXISTS t.ns");
    spark.sql("CREATE TABLE " + table + " (old string, __metadata__ " + METADATA + ") USING iceberg"
        + " PARTITIONED BY (hours(__metadata__.kafka_ingestion_ts)) TBLPROPERTIES ("
        + "'format-version'='1', 'write.format.default'='" + format + "',"
        + " 'write.parquet.compression-codec'='zstd', 'write.orc.compression-codec'='lz4',"
        + " 'write.avro.compression-codec'='snappy', 'write.metadata.metrics.default'='counts',"
        + " 'write.metadata.metrics.column.__metadata__.offset'='full', 'write.distribution-mode'='none',"
        + " 'write.data.path'='" + TopicWriterTest.warehouse.resolve("elsewhere/" + name).toUri() + "')");
    spark.sql("ALTER TABLE " + table + " DROP COLUMN old");
    spark.sql("ALTER TABLE " + table + " ADD COLUMN title string FIRST");
    // WRITE LOCALLY ORDERED BY, without Iceberg's SQL extensions.
    Spark3Util.loadIcebergTable(spark, table).replaceSortOrder().asc("__metadata__.kafka_ingestion_ts").commit();
  }

  /**
   * The table's partition spec evolved from the hour of the ingestion time to the day, a bucket of the
   * title and the Kafka partition.
   */
  static void partitionOtherwise(String name) throws Exception {
    Spark3Util.loadIcebergTable(spark, "t.ns." + name)
        .updateSpec()
        .removeField("__metadata__.kafka_ingestion_ts_hour")
        .addField(Expressions.day("__metadata__.kafka_ingestion_ts"))
        .addField(Expressions.bucket("title", 2))
        .addField("__metadata__.partition")
        .commit();
  }

  @ParameterizedTest
  @CsvSource({"parquet,hour", "orc,hour", "avro,hour", "parquet,other", "orc,other"})
  void theOneWritersFilesAreSparksWritersFilesForTheSameRows(String format, String partitioning)
      throws Exception {
    String ours = "ours_" + format + "_" + partitioning;
    String theirs = "spark_" + format + "_" + partitioning;
    createArchive(ours, format);
    createArchive(theirs, format);
    if (partitioning.equals("other")) {
      partitionOtherwise(ours);
      partitionOtherwise(theirs);
    }
    spark.sql("CREATE TABLE t.ns." + ours + "__dlq (raw_value binary, error string, __metadata__ " + METADATA
        + ", redriven_at timestamp) USING iceberg PARTITIONED BY (hours(__metadata__.kafka_ingestion_ts))");
    // Out of ingestion order, over three hours, in one task (Spark's writer then makes a file per hour too).
    List<Row> rows = new ArrayList<>();
    long[] minutes = {130, 50, 10, 70, 30, 90, 20, 150, 65, 5};
    for (int i = 0; i < minutes.length; i++) {
      rows.add(record("title-" + i, i % 2, 100 + i, START_MICROS + minutes[i] * 60_000_000L));
    }
    Dataset<Row> records = spark.createDataFrame(rows, RECORDS).coalesce(1);
    long writeMicros = START_MICROS + 5 * HOUR_MICROS;

    var outcome =
        new ObjectMapper()
            .readTree(append(records, "q", writeMicros, "t.ns." + ours, "t.ns." + ours + "__dlq").json())
            .get(0);
    assertTrue(outcome.get("error").isNull(), outcome.toString());
    combined(records)
        .where("a IS NOT NULL")
        .select("a.*")
        .withColumn("__metadata__",
            // Nullable, as the column is: Spark's writer gives a non-null column's Parquet field as required.
            col("__metadata__").withField("router_write_ts",
                when(col("__metadata__.offset").isNotNull(), lit(new Timestamp(writeMicros / 1000)))))
        .writeTo("t.ns." + theirs)
        .append();

    Map<String, DataFile> ourFiles = filesByPartition("t.ns." + ours);
    Map<String, DataFile> theirFiles = filesByPartition("t.ns." + theirs);
    assertEquals(theirFiles.keySet(), ourFiles.keySet(), "a file per partition");
    assertTrue(ourFiles.size() >= 3, ourFiles.keySet().toString());
    Table table = Spark3Util.loadIcebergTable(spark, "t.ns." + ours);
    int title = table.schema().findField("title").fieldId();
    int offset = table.schema().findField("__metadata__.offset").fieldId();
    assertTrue(title > offset, "the title was added after the metadata: its id is not its position");
    for (String partition : ourFiles.keySet()) {
      DataFile mine = ourFiles.get(partition);
      DataFile spark = theirFiles.get(partition);
      String where = format + " " + partition + ": ";
      assertEquals(spark.specId(), mine.specId(), where + "spec");
      assertTrue(mine.location().contains(TopicWriterTest.warehouse + "/elsewhere/" + ours + "/"),
          where + mine.location());
      assertTrue(spark.location().contains(TopicWriterTest.warehouse + "/elsewhere/" + theirs + "/"),
          where + spark.location());
      assertEquals(spark.format(), mine.format(), where + "format");
      assertEquals(format.toUpperCase(), mine.format().name());
      assertEquals(spark.recordCount(), mine.recordCount(), where + "rows");
      assertEquals(spark.sortOrderId(), mine.sortOrderId(), where + "sort order");
      assertEquals(keys(spark.valueCounts()), keys(mine.valueCounts()), where + "value counts");
      assertEquals(spark.nullValueCounts(), mine.nullValueCounts(), where + "null counts");
      assertEquals(keys(spark.lowerBounds()), keys(mine.lowerBounds()), where + "lower bounds");
      assertEquals(keys(spark.upperBounds()), keys(mine.upperBounds()), where + "upper bounds");
      if (!format.equals("avro")) { // Avro files record no bounds
        assertTrue(mine.lowerBounds().containsKey(offset), where + "full metrics for the offset");
      }
      assertFalse(keys(mine.lowerBounds()).contains(title), where + "counts alone for the title");
      assertEquals(rowsOf("t.ns." + theirs, spark), rowsOf("t.ns." + ours, mine), where + "rows in order");
      if (format.equals("parquet")) {
        ParquetMetadata myFooter = footer(mine);
        ParquetMetadata sparkFooter = footer(spark);
        assertEquals(sparkFooter.getFileMetaData().getSchema(), myFooter.getFileMetaData().getSchema(),
            where + "the file's schema, field ids included");
        for (BlockMetaData block : myFooter.getBlocks()) {
          for (ColumnChunkMetaData column : block.getColumns()) {
            assertEquals("ZSTD", column.getCodec().name(), where + column.getPath());
          }
        }
      }
    }
  }

  @org.junit.jupiter.api.Test
  void aTableSortedOtherwiseIsLeftToSparksWriterNamingItsOrder() throws Exception {
    createArchive("sorted_otherwise", "parquet");
    Spark3Util.loadIcebergTable(spark, "t.ns.sorted_otherwise").replaceSortOrder().asc("title").commit();
    spark.sql("CREATE TABLE t.ns.sorted_otherwise__dlq (raw_value binary, error string, __metadata__ "
        + METADATA + ", redriven_at timestamp) USING iceberg"
        + " PARTITIONED BY (hours(__metadata__.kafka_ingestion_ts))");
    Dataset<Row> records =
        spark.createDataFrame(List.of(record("a", 0, 1, START_MICROS)), RECORDS);
    var outcome =
        new ObjectMapper()
            .readTree(append(records, "q", START_MICROS, "t.ns.sorted_otherwise",
                "t.ns.sorted_otherwise__dlq").json())
            .get(0);
    String error = outcome.get("error").asText();
    assertTrue(error.startsWith("t.ns.sorted_otherwise is sorted by ") && error.contains("title"), error);
    assertEquals(0L, spark.sql("SELECT count(*) FROM t.ns.sorted_otherwise").first().getLong(0));
  }

  static java.util.Set<Integer> keys(Map<Integer, ?> bounds) {
    return bounds == null ? java.util.Set.of() : bounds.keySet();
  }

  /** The table's data files by their partition's values. */
  static Map<String, DataFile> filesByPartition(String name) throws Exception {
    Table table = Spark3Util.loadIcebergTable(spark, name);
    table.refresh();
    Map<String, DataFile> files = new TreeMap<>();
    try (CloseableIterable<FileScanTask> tasks = table.newScan().includeColumnStats().planFiles()) {
      for (FileScanTask task : tasks) {
        DataFile file = task.file();
        List<Object> values = new ArrayList<>();
        for (int i = 0; i < file.partition().size(); i++) {
          values.add(file.partition().get(i, Object.class));
        }
        DataFile before = files.put(values.toString(), file.copy());
        assertEquals(null, before, name + ": one file a partition");
      }
    }
    return files;
  }

  /** The rows of one data file, in the file's order. */
  static List<String> rowsOf(String table, DataFile file) {
    List<String> rows = new ArrayList<>();
    for (Row row : spark.sql("SELECT _pos, title, __metadata__ FROM " + table + " WHERE _file = '"
        + file.location() + "' ORDER BY _pos").collectAsList()) {
      rows.add(row.get(1) + " " + row.get(2));
    }
    return rows;
  }

  static ParquetMetadata footer(DataFile file) throws Exception {
    var path = new org.apache.hadoop.fs.Path(file.location());
    try (ParquetFileReader reader =
        ParquetFileReader.open(HadoopInputFile.fromPath(path, new Configuration()))) {
      return reader.getFooter();
    }
  }
}
