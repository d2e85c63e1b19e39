package io.bergstream.router;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.length;
import static org.apache.spark.sql.functions.lit;
import static org.apache.spark.sql.functions.struct;
import static org.apache.spark.sql.functions.when;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;
import org.apache.iceberg.spark.Spark3Util;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The one writer of every topic's tables: a topic's rows planned once (TopicRows) and written by one job
 * into Iceberg's files, each table committed once with the batch's properties (TopicTables).
 */
class TopicWriterTest {
  /** Kafka's records, as Spark's Kafka source gives the columns the rows read. */
  static final StructType RECORDS =
      new StructType()
          .add("value", DataTypes.BinaryType)
          .add("topic", DataTypes.StringType)
          .add("partition", DataTypes.IntegerType)
          .add("offset", DataTypes.LongType)
          .add("timestamp", DataTypes.TimestampType);
  static final long HOUR_MICROS = 3_600_000_000L;
  static final long START_MICROS = 1_795_000_000_000_000L / HOUR_MICROS * HOUR_MICROS;
  static SparkSession spark;
  static Path warehouse;

  @BeforeAll
  static void session() throws Exception {
    warehouse = Files.createTempDirectory("bergstream-writer-test");
    spark =
        SparkSession.builder()
            .master("local[2]")
            .appName("bergstream-writer-test")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.catalog.t", "org.apache.iceberg.spark.SparkCatalog")
            .config("spark.sql.catalog.t.type", "hadoop")
            .config("spark.sql.catalog.t.warehouse", warehouse.toUri().toString())
            .getOrCreate();
  }

  @AfterAll
  static void stop() throws Exception {
    spark.stop();
    try (var paths = Files.walk(warehouse)) {
      for (Path path : paths.sorted(Comparator.reverseOrder()).toList()) {
        Files.delete(path);
      }
    }
  }

  /** The rows of a topic: the value as a title when it has one, else a dead letter saying so. */
  static Dataset<Row> combined(Dataset<Row> records) {
    var metadata =
        struct(
            col("timestamp").alias("kafka_ingestion_ts"), col("topic"), col("partition"), col("offset"),
            lit(null).cast("timestamp").alias("router_write_ts"));
    var parsed = length(col("value")).gt(0);
    return records.select(
        when(parsed, struct(col("value").cast("string").alias("title"), metadata.alias("__metadata__")))
            .alias("a"),
        when(length(col("value")).equalTo(0),
                struct(col("value").alias("raw_value"), lit("empty value").alias("error"),
                    metadata.alias("__metadata__"), lit(null).cast("timestamp").alias("redriven_at")))
            .alias("d"));
  }

  static TopicRows plan() {
    Dataset<Row> template =
        spark.createDataFrame(new JavaSparkContext(spark.sparkContext()).<Row>emptyRDD(), RECORDS);
    return TopicRows.of(combined(template), "__metadata__", "kafka_ingestion_ts", "partition", "offset",
        "router_write_ts");
  }

  static Row record(String value, int partition, long offset, long micros) {
    return record("plays", value, partition, offset, micros);
  }

  static Row record(String topic, String value, int partition, long offset, long micros) {
    Timestamp time = new Timestamp(micros / 1000);
    return RowFactory.create(value.getBytes(StandardCharsets.UTF_8), topic, partition, offset, time);
  }

  static final List<String> KEYS = List.of("q", "b", "topic", "cluster", "start", "next");

  static BatchWrite append(Dataset<Row> records, String query, long writeMicros) throws Exception {
    return append(records, query, writeMicros, "t.ns.plays", "t.ns.plays__dlq");
  }

  /** A table named null holds the batch already. */
  static BatchWrite append(
      Dataset<Row> records, String query, long writeMicros, String archive, String deadLetters)
      throws Exception {
    Map<String, String> properties =
        Map.of("q", query, "b", "7", "topic", "plays", "cluster", "test", "start", "{\"0\":100,\"1\":101}",
            "next", "{\"0\":105,\"1\":106}");
    BatchWrite written = TopicTables.write(spark, records, RECORDS.fieldIndex("topic"),
        List.of(new TopicWrite("plays", plan(), archive, deadLetters, archive == null, deadLetters == null,
            properties)),
        writeMicros, 2, Map.of("plays", 2), KEYS);
    written.commit(List.of(0), 2);
    return written;
  }

  /** A topic's archive table and dead-letter table, as bergstream makes them, in t.ns. */
  static void createTables(String name) {
    spark.sql("CREATE NAMESPACE IF NOT EXISTS t.ns");
    String metadata =
        "struct<kafka_ingestion_ts: timestamp, topic: string, partition: int, offset: bigint,"
            + " router_write_ts: timestamp>";
    spark.sql("CREATE TABLE t.ns." + name + " (title string, __metadata__ " + metadata + ") USING iceberg"
        + " PARTITIONED BY (hours(__metadata__.kafka_ingestion_ts))");
    spark.sql("CREATE TABLE t.ns." + name + "__dlq (raw_value binary, error string, __metadata__ " + metadata
        + ", redriven_at timestamp) USING iceberg PARTITIONED BY (hours(__metadata__.kafka_ingestion_ts))");
  }

  static long snapshots(String name) throws Exception {
    Table table = Spark3Util.loadIcebergTable(spark, name);
    table.refresh();
    long count = 0;
    for (Snapshot ignored : table.snapshots()) {
      count++;
    }
    return count;
  }

  @Test
  void aPlanAppliesTheRowsProjectionsToARecordAndEachThreadHasItsOwnCopy() throws Exception {
    TopicRows rows = plan();
    InternalRow record =
        new GenericInternalRow(
            new Object[] {"Dark".getBytes(StandardCharsets.UTF_8), UTF8String.fromString("plays"), 1, 42L,
                START_MICROS});
    InternalRow out = TopicRows.apply(rows.projections(0), record);
    InternalRow archived = out.getStruct(0, 2);
    assertEquals("Dark", archived.getUTF8String(0).toString());
    InternalRow metadata = archived.getStruct(1, 5);
    assertEquals(START_MICROS, metadata.getLong(0));
    assertEquals(1, metadata.getInt(2));
    assertEquals(42L, metadata.getLong(3));
    assertTrue(out.isNullAt(1));
    InternalRow empty =
        new GenericInternalRow(new Object[] {new byte[0], UTF8String.fromString("plays"), 0, 7L, START_MICROS});
    InternalRow dead = TopicRows.apply(rows.projections(0), empty).getStruct(1, 4);
    assertEquals("empty value", dead.getUTF8String(1).toString());

    // An expression may keep state between rows: another thread compiles its own copy of the plan.
    AtomicReference<List<UnsafeProjection>> other = new AtomicReference<>();
    Thread thread = new Thread(() -> other.set(rows.projections(0)));
    thread.start();
    thread.join();
    assertNotSame(rows.projections(0).get(0), other.get().get(0));
    Field expressions = TopicRows.class.getDeclaredField("expressions");
    expressions.setAccessible(true);
    var mine = (scala.collection.Seq<?>) ((List<?>) expressions.get(rows)).get(0);
    var copied = (scala.collection.Seq<?>) ((List<?>) expressions.get(rows.copied())).get(0);
    assertEquals(mine.size(), copied.size());
    for (int i = 0; i < mine.size(); i++) {
      var expression = (org.apache.spark.sql.catalyst.expressions.Expression) mine.apply(i);
      var copy = (org.apache.spark.sql.catalyst.expressions.Expression) copied.apply(i);
      assertTrue(expression.semanticEquals(copy), expression + " against " + copy);
      assertNotSame(expression, copy);
    }
  }

  @Test
  void topicsSharingOnePlanEachGetTheirOwnRecordsInTheirOwnTables() throws Exception {
    TopicRows shared = plan();
    // Two topics' records interleaved in one task: one thread, one compiled copy of the shared plan.
    List<String> topics = List.of("shared_plays", "shared_views");
    List<Row> rows = new ArrayList<>();
    for (int i = 0; i < 8; i++) {
      String topic = topics.get(i % 2);
      rows.add(record(topic, i == 5 ? "" : topic + "-" + i, 0, 100 + i, START_MICROS + i * 60_000_000L));
    }
    List<TopicWrite> writes = new ArrayList<>();
    for (String topic : topics) {
      createTables(topic);
      Map<String, String> properties =
          Map.of("q", "query-s", "b", "1", "topic", topic, "cluster", "test", "start", "{\"0\":100}",
              "next", "{\"0\":108}");
      writes.add(new TopicWrite(topic, shared, "t.ns." + topic, "t.ns." + topic + "__dlq", false, false,
          properties));
    }
    Dataset<Row> records = spark.createDataFrame(rows, RECORDS).coalesce(1);
    BatchWrite written =
        TopicTables.write(spark, records, RECORDS.fieldIndex("topic"), writes, START_MICROS, 2, Map.of(), KEYS);
    written.commit(List.of(0, 1), 2);

    for (String topic : topics) {
      List<Row> archived =
          spark.sql("SELECT title, __metadata__.topic FROM t.ns." + topic + " ORDER BY __metadata__.offset")
              .collectAsList();
      List<Row> dead = spark.sql("SELECT __metadata__.topic FROM t.ns." + topic + "__dlq").collectAsList();
      assertEquals(topic.equals("shared_views") ? 3 : 4, archived.size(), topic + ": " + archived);
      assertEquals(topic.equals("shared_views") ? 1 : 0, dead.size(), topic + "'s dead letters: " + dead);
      for (Row row : archived) {
        assertTrue(row.getString(0).startsWith(topic + "-"), topic + " holds " + row);
        assertEquals(topic, row.getString(1));
      }
      for (Row row : dead) {
        assertEquals(topic, row.getString(0));
      }
    }
  }

  @Test
  void oneJobWritesATopicsTablesSortedByHourAndCommitsEachOnceWithTheBatchsProperties() throws Exception {
    createTables("plays");
    // Out of order within each partition, over two hours; one empty value.
    List<Row> rows = new ArrayList<>();
    long[] minutes = {50, 10, 70, 30, 90, 20};
    for (int i = 0; i < minutes.length; i++) {
      rows.add(record(i == 3 ? "" : "title-" + i, i % 2, 100 + i, START_MICROS + minutes[i] * 60_000_000L));
    }
    Dataset<Row> records = spark.createDataFrame(rows, RECORDS).repartition(2);
    long writeMicros = START_MICROS + 5 * HOUR_MICROS;
    BatchWrite written = append(records, "query-a", writeMicros);

    JsonNode outcome = new ObjectMapper().readTree(written.json()).get(0);
    assertTrue(outcome.get("error").isNull(), outcome.toString());
    JsonNode totals = outcome.get("totals");
    assertEquals(5, totals.get(0).asLong());
    assertEquals(1, totals.get(1).asLong());
    assertEquals("[3,100,104]", outcome.get("partitions").get("0").toString());
    assertEquals("[3,101,105]", outcome.get("partitions").get("1").toString());

    for (String name : List.of("t.ns.plays", "t.ns.plays__dlq")) {
      Table table = Spark3Util.loadIcebergTable(spark, name);
      List<Snapshot> snapshots = new ArrayList<>();
      table.snapshots().forEach(snapshots::add);
      assertEquals(1, snapshots.size(), name + ": one commit");
      assertEquals("7", snapshots.get(0).summary().get("b"));
    }
    // Every file one hour, in ingestion order; every row stamped with the batch's write time.
    List<Row> archived =
        spark.sql("SELECT _file, __metadata__.kafka_ingestion_ts AS at, __metadata__.router_write_ts AS w,"
            + " __metadata__.offset AS o FROM t.ns.plays").collectAsList();
    assertEquals(5, archived.size());
    Map<String, Timestamp> last = new java.util.HashMap<>();
    java.util.Set<String> files = new java.util.HashSet<>();
    for (Row row : archived) {
      String file = row.getString(0);
      files.add(file);
      Timestamp at = row.getTimestamp(1);
      Timestamp before = last.put(file, at);
      assertTrue(before == null || !at.before(before), file + " is not in ingestion order");
      assertEquals(writeMicros / 1000, row.getTimestamp(2).getTime());
    }
    assertTrue(files.size() >= 2, "two hours, two files at least: " + files);
    Row dead = spark.sql("SELECT error, __metadata__.offset FROM t.ns.plays__dlq").first();
    assertEquals("empty value", dead.getString(0));
    assertEquals(103L, dead.getLong(1));
    assertNull(spark.sql("SELECT redriven_at FROM t.ns.plays__dlq").first().get(0));

    // Another router's query writing the same offsets finds this one's commit, and writes nothing.
    JsonNode second = new ObjectMapper().readTree(append(records, "query-b", writeMicros).json()).get(0);
    String found = second.get("second_writer").asText();
    assertTrue(found.startsWith("query query-a committed partition 0 offsets 100 to 104, partition 1 offsets"
        + " 101 to 105 in snapshot "), found);
    assertEquals(5L, spark.sql("SELECT count(*) FROM t.ns.plays").first().getLong(0));
  }

  @Test
  void aReplayWritesOnlyTheTableThatLacksTheBatchAndCountsEveryRecord() throws Exception {
    createTables("replayed");
    List<Row> rows = new ArrayList<>();
    for (int i = 0; i < 6; i++) {
      rows.add(record(i == 2 ? "" : "title-" + i, i % 2, 100 + i, START_MICROS + i * 60_000_000L));
    }
    Dataset<Row> records = spark.createDataFrame(rows, RECORDS).repartition(2);
    // The archive holds the batch (its commit landed before the failure); the dead-letter table does not.
    JsonNode outcome =
        new ObjectMapper()
            .readTree(append(records, "query-r", START_MICROS, null, "t.ns.replayed__dlq").json())
            .get(0);
    assertTrue(outcome.get("error").isNull(), outcome.toString());
    JsonNode totals = outcome.get("totals");
    assertEquals(5, totals.get(0).asLong(), "every archive row counted");
    assertEquals(1, totals.get(1).asLong());
    assertEquals(0, totals.get(2).asLong(), "no archive file");
    assertTrue(totals.get(4).asLong() > 0, "a dead-letter file");
    assertEquals(0L, snapshots("t.ns.replayed"), "the archive not committed to");
    assertEquals(1L, snapshots("t.ns.replayed__dlq"));
    assertEquals(1L, spark.sql("SELECT count(*) FROM t.ns.replayed__dlq").first().getLong(0));
    assertEquals(0L, spark.sql("SELECT count(*) FROM t.ns.replayed").first().getLong(0));
  }

  /**
   * Tables `name` made, and batch 3's files for them written and held (offsets 100 to 108), as an earlier
   * version of the router held them.
   */
  static PendingFiles heldBatch3(String name) throws Exception {
    createTables(name);
    PendingFiles held = new PendingFiles();
    EarlierPending.hold(held, TopicTables.write(spark, offsets(100, 108), RECORDS.fieldIndex("topic"),
        List.of(pendingWrite(name, 3, 100, 108)), START_MICROS, 1, Map.of(), KEYS), 3, 0);
    return held;
  }

  static TopicWrite pendingWrite(String table, long batch, int first, int end) {
    Map<String, String> properties =
        Map.of("q", "query-p", "b", Long.toString(batch), "topic", "plays", "cluster", "test", "start",
            "{\"0\":" + first + "}", "next", "{\"0\":" + end + "}");
    return new TopicWrite("plays", plan(), "t.ns." + table, "t.ns." + table + "__dlq", false, false,
        properties);
  }

  static Dataset<Row> offsets(int first, int end) {
    List<Row> rows = new ArrayList<>();
    for (int offset = first; offset < end; offset++) {
      rows.add(record(offset % 4 == 0 ? "" : "title-" + offset, 0, offset, START_MICROS + offset * 1_000_000L));
    }
    return spark.createDataFrame(rows, RECORDS).coalesce(1);
  }

  @Test
  void filesAnEarlierVersionLeftPendingAreCommittedOnceByEachRestart() throws Exception {
    createTables("pending");
    String archive = "t.ns.pending";
    String dead = "t.ns.pending__dlq";
    PendingFiles pending = new PendingFiles();
    // Batch 7 written and held, its files recorded: nothing committed.
    BatchWrite seventh = TopicTables.write(spark, offsets(100, 108), RECORDS.fieldIndex("topic"),
        List.of(pendingWrite("pending", 7, 100, 108)), START_MICROS, 1, Map.of(), KEYS);
    EarlierPending.hold(pending, seventh, 7, 0);
    assertEquals(0L, snapshots(archive));
    assertEquals(0L, snapshots(dead));
    Path records = Files.createTempDirectory(warehouse, "pending");
    EarlierPending.record(pending, spark, records.resolve("7.json").toString(),
        "{\"batch\": 7, \"query\": \"query-p\", \"tables\": {\"" + archive + "\": {\"records\": 6}, \""
            + dead + "\": {\"records\": 2}}}");

    // Started on it: batch 7's files committed, each table once; stopped before the record was cleared.
    PendingFiles restarted = new PendingFiles();
    restarted.load(spark, records.toString());
    Map<String, String> summary = Map.of("q", "query-p", "b", "7");
    assertTrue(restarted.flush(spark, archive, "q", "b", 7, summary)[0] > 0);
    assertTrue(restarted.flush(spark, dead, "q", "b", 7, summary)[0] > 0);
    assertEquals(6L, spark.sql("SELECT count(*) FROM " + archive).first().getLong(0));
    assertEquals(2L, spark.sql("SELECT count(*) FROM " + dead).first().getLong(0));

    // Batch 9 held and recorded beside batch 7's record, which still names its files.
    BatchWrite ninth = TopicTables.write(spark, offsets(112, 116), RECORDS.fieldIndex("topic"),
        List.of(pendingWrite("pending", 9, 112, 116)), START_MICROS, 1, Map.of(), KEYS);
    EarlierPending.hold(pending, ninth, 9, 0);
    EarlierPending.record(pending, spark, records.resolve("9.json").toString(),
        "{\"batch\": 9, \"query\": \"query-p\", \"tables\": {\"" + archive + "\": {}}}");
    PendingFiles stale = new PendingFiles();
    stale.load(spark, records.toString());
    // Started again: batch 9's files alone are committed; batch 7's, which the table holds, are not again.
    long[] nine = stale.flush(spark, archive, "q", "b", 9, Map.of("q", "query-p", "b", "9"));
    assertTrue(nine[0] > 0, java.util.Arrays.toString(nine));
    assertEquals(9L, spark.sql("SELECT count(*) FROM " + archive).first().getLong(0));
    java.nio.file.Files.delete(records.resolve("9.json"));

    // Started once more before the last record was cleared: each table holds batch 7, nothing appended.
    PendingFiles again = new PendingFiles();
    JsonNode loaded = new ObjectMapper().readTree(again.load(spark, records.toString()));
    assertEquals(1, loaded.size());
    assertEquals(7, loaded.get(0).get("batch").asLong());
    assertTrue(loaded.get(0).get("tables").get(archive).get("files").asLong() > 0, loaded.toString());
    assertEquals(-1, again.flush(spark, archive, "q", "b", 7, summary)[0]);
    assertEquals(-1, again.flush(spark, dead, "q", "b", 7, summary)[0]);
    assertEquals(9L, spark.sql("SELECT count(*) FROM " + archive).first().getLong(0));
    assertEquals(2L, spark.sql("SELECT count(*) FROM " + dead).first().getLong(0));

    // Of a record whose batch was never committed, a restart commits the files read back from it, once.
    PendingFiles first = heldBatch3("restarted");
    Path restartedRecords = Files.createTempDirectory(warehouse, "restarted");
    EarlierPending.record(first, spark, restartedRecords.resolve("3.json").toString(),
        "{\"batch\": 3, \"query\": \"query-p\", \"tables\": {\"t.ns.restarted\": {}}}");
    PendingFiles second = new PendingFiles();
    second.load(spark, restartedRecords.toString());
    long[] flushed = second.flush(spark, "t.ns.restarted", "q", "b", 3, Map.of("q", "query-p", "b", "3"));
    assertTrue(flushed[0] > 0, java.util.Arrays.toString(flushed));
    assertEquals(6L, spark.sql("SELECT count(*) FROM t.ns.restarted").first().getLong(0));
    assertEquals(-1, second.flush(spark, "t.ns.restarted", "q", "b", 3, Map.of("q", "query-p", "b", "3"))[0]);
    assertEquals(6L, spark.sql("SELECT count(*) FROM t.ns.restarted").first().getLong(0));
    // A table dropped and made again under its name since its files were recorded: another table (another
    // uuid), into which its files are not committed; a table dropped and not made again: gone.
    PendingFiles held = heldBatch3("remade");
    Path remade = Files.createTempDirectory(warehouse, "remade");
    EarlierPending.record(held, spark, remade.resolve("3.json").toString(),
        "{\"batch\": 3, \"query\": \"query-p\", \"tables\": {\"t.ns.remade\": {}, "
            + "\"t.ns.remade__dlq\": {}}}");
    spark.sql("DROP TABLE t.ns.remade");
    spark.sql("DROP TABLE t.ns.remade__dlq");
    spark.sql("CREATE TABLE t.ns.remade (title string, other string) USING iceberg");
    PendingFiles started = new PendingFiles();
    JsonNode tables =
        new ObjectMapper().readTree(started.load(spark, remade.toString())).get(0).get("tables");
    String uuid = Spark3Util.loadIcebergTable(spark, "t.ns.remade").uuid().toString();
    assertTrue(tables.get("t.ns.remade").get("replaced").asText().contains("(uuid " + uuid + ", not "),
        tables.toString());
    assertTrue(tables.get("t.ns.remade").get("files").asLong() > 0, tables.toString());
    assertEquals("table t.ns.remade__dlq does not exist: dropped",
        tables.get("t.ns.remade__dlq").get("replaced").asText());
    assertEquals(0, started.batches("t.ns.remade").length);
    assertEquals(0, started.flush(spark, "t.ns.remade", "q", "b", 3, Map.of("q", "query-p", "b", "3"))[0]);
    assertEquals(0L, snapshots("t.ns.remade"));
  }
}
