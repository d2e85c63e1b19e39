package io.bergstream.router;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ExecutorService;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.SerializableTable;
import org.apache.iceberg.SortDirection;
import org.apache.iceberg.SortField;
import org.apache.iceberg.SortOrder;
import org.apache.iceberg.Table;
import org.apache.iceberg.relocated.com.google.common.util.concurrent.MoreExecutors;
import org.apache.iceberg.spark.Spark3Util;
import org.apache.iceberg.spark.SparkSchemaUtil;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.StructType;
import scala.Option;

/**
 * The appends of many topics' tables in one micro-batch: one Spark job writes every topic's files, then
 * each table gets one commit, several at once.
 *
 * <p>A router of many topics in one query (`router run --pattern`) would otherwise run a Spark write job
 * and an Iceberg commit per table and batch, one after another: their fixed cost, not the records, would
 * bound how many topics a driver keeps up with. Here each topic's rows come as a frame of two structs,
 * {@code a} (the archive row, in the archive table's column order) and {@code d} (the dead letter, in the
 * dead-letter table's), exactly one of them set per record; every frame's partitions are tasks of the
 * same job. A task writes the archive rows and the dead letters of its part of one topic into data files
 * of their tables' hours, sorted by ingestion time (the tables' order), with the file writers Spark's own
 * Iceberg writer uses ({@link TableFiles}: the table's format, properties, metrics and schema; more files
 * when its rows pass its buffer, {@link #taskBufferBytes}), and counts what it read per
 * Kafka partition. The driver then appends each table's files with
 * the batch's snapshot properties: the archive table before the dead-letter table, as the router of one
 * topic does.
 */
public final class TopicTables {
  static final ExecutorService SAME_THREAD = MoreExecutors.newDirectExecutorService();

  private TopicTables() {}

  static final long MICROS_PER_HOUR = 3_600_000_000L;
  /** Spark's choice of generated or interpreted code for the projections a task makes. */
  static final String FACTORY_MODE = "spark.sql.codegen.factoryMode";
  /** What a kept row costs beyond its bytes: its object, its array and its place in the list. */
  static final long ROW_OVERHEAD = 64;
  /** The Spark setting of the bytes of rows a task holds before it writes them. */
  public static final String BUFFER_BYTES = "spark.bergstream.router.taskBufferBytes";

  /**
   * The bytes of rows a task holds before it writes them: unless set, a sixth of the heap, shared by as
   * many tasks as the JVM has processors. A batch larger than that (a backlog read with a high rate limit)
   * is written in more files, never held whole.
   */
  static long taskBufferBytes() {
    Runtime runtime = Runtime.getRuntime();
    long share = Math.max(16L << 20, runtime.maxMemory() / 6 / Math.max(1, runtime.availableProcessors()));
    SparkEnv env = SparkEnv.get();
    return env == null ? share : env.conf().getSizeAsBytes(BUFFER_BYTES, Long.toString(share));
  }

  /**
   * What the tasks need of each plan and table, broadcast once and kept while they stay the same: a
   * closure holding hundreds of topics' plans and tables would be serialized, checked and shipped again
   * for every batch. A plan shared by several topics (TopicRows: one schema) is broadcast once, and
   * destroyed when no topic uses it any more.
   */
  private static final Map<String, Broadcast<TopicRows>> PLANS = new HashMap<>();
  private static final Map<String, String> PLAN_OF_TOPIC = new HashMap<>();
  private static final Map<String, Map.Entry<String, Broadcast<Table>>> TABLES = new HashMap<>();
  /** The context the broadcasts belong to: a new one (a session stopped and made again) has none of them. */
  private static SparkContext broadcastsOf;

  private static void sameContext(JavaSparkContext context) {
    if (broadcastsOf != context.sc()) {
      PLANS.clear();
      PLAN_OF_TOPIC.clear();
      TABLES.clear();
      broadcastsOf = context.sc();
    }
  }

  private static synchronized Broadcast<TopicRows> plan(
      JavaSparkContext context, String topic, TopicRows rows) {
    sameContext(context);
    String was = PLAN_OF_TOPIC.put(topic, rows.id());
    Broadcast<TopicRows> made = PLANS.computeIfAbsent(rows.id(), id -> context.broadcast(rows));
    if (was != null && !was.equals(rows.id()) && !PLAN_OF_TOPIC.containsValue(was)) {
      PLANS.remove(was).destroy(false);
    }
    return made;
  }

  private static synchronized Broadcast<Table> table(JavaSparkContext context, String name, Table table) {
    sameContext(context);
    // What writing a file needs of a table; its snapshots change with every commit, and do not matter.
    String version =
        table.schema().schemaId() + "/" + table.spec().specId() + "/" + table.sortOrder().orderId()
            + "/" + table.properties().hashCode() + "/" + table.location();
    Map.Entry<String, Broadcast<Table>> known = TABLES.get(name);
    if (known != null && known.getKey().equals(version)) {
      return known.getValue();
    }
    Broadcast<Table> made = context.broadcast(SerializableTable.copyOf(table));
    TABLES.put(name, Map.entry(version, made));
    if (known != null) {
      known.getValue().destroy(false);
    }
    return made;
  }

  /**
   * Writes every topic's part of {@code records} (the micro-batch, whose column {@code topicColumn} names
   * each record's topic) into data files of its tables, and commits none: {@code writes[i]} gives the plan of
   * topic i's rows, its tables and its commit's summary, {@code writeMicros} is every row's router_write_ts.
   * One job of at most {@code tasks} tasks, a topic read by {@code shares.get(topic)} of them at most (one
   * when not named: TopicGroups). A topic whose tables cannot be written this way has the reason in its
   * outcome. The files are committed by {@link BatchWrite}.
   */
  public static BatchWrite write(
      SparkSession spark,
      Dataset<Row> records,
      int topicColumn,
      List<TopicWrite> writes,
      long writeMicros,
      int tasks,
      Map<String, Integer> shares,
      List<String> keys)
      throws Exception {
    SecondWriters.Keys names =
        new SecondWriters.Keys(keys.get(0), keys.get(1), keys.get(2), keys.get(3), keys.get(4), keys.get(5));
    long started = System.nanoTime();
    int count = writes.size();
    List<Table> archiveTables = new ArrayList<>(count);
    List<Table> deadLetterTables = new ArrayList<>(count);
    List<TopicResult> outcomes = new ArrayList<>(count);
    List<List<DataFile>> archiveFiles = new ArrayList<>(count);
    List<List<DataFile>> deadLetterFiles = new ArrayList<>(count);
    Map<String, Integer> writable = new HashMap<>();
    JavaSparkContext context = JavaSparkContext.fromSparkContext(spark.sparkContext());
    List<Broadcast<TopicRows>> plans = new ArrayList<>(count);
    List<Broadcast<Table>> archiveCopies = new ArrayList<>(count);
    List<Broadcast<Table>> deadLetterCopies = new ArrayList<>(count);
    String operation = UUID.randomUUID().toString();
    for (int i = 0; i < count; i++) {
      TopicWrite topic = writes.get(i);
      TopicResult outcome = new TopicResult(topic.topic);
      outcomes.add(outcome);
      archiveFiles.add(new ArrayList<>());
      deadLetterFiles.add(new ArrayList<>());
      // A table that holds the batch already (a replay) is loaded all the same; its rows are counted, not
      // written.
      Table archive = load(spark, topic.archive);
      Table deadLetter = load(spark, topic.deadLetters);
      archiveTables.add(archive);
      deadLetterTables.add(deadLetter);
      RowLayout layout = topic.rows.layout();
      String refused = topic.archiveHolds
          ? null : unwritable(archive, topic.archive, topic.rows.archiveType(), layout.archiveMetadata, layout);
      if (refused == null && !topic.deadLettersHold) {
        refused = unwritable(
            deadLetter, topic.deadLetters, topic.rows.deadLetterType(), layout.deadLetterMetadata, layout);
      }
      if (refused == null && archive != null && !topic.archiveHolds) {
        // Another router of the topic: nothing is written, and the router stops (bergstream.router.archiver).
        outcome.secondWriter = SecondWriters.overlapping(archive, topic.properties, names, false);
        refused = outcome.secondWriter == null ? null : "another router writes the topic";
      }
      boolean writesArchive = refused == null && archive != null && !topic.archiveHolds;
      boolean writesDeadLetters = refused == null && deadLetter != null && !topic.deadLettersHold;
      plans.add(refused == null ? plan(context, topic.topic, topic.rows) : null);
      archiveCopies.add(writesArchive ? table(context, topic.archive, archive) : null);
      deadLetterCopies.add(writesDeadLetters ? table(context, topic.deadLetters, deadLetter) : null);
      if (refused != null) {
        outcome.error = refused; // written on its own, by Spark's writer
      } else {
        writable.put(topic.topic, i);
      }
    }
    long planned = System.nanoTime();
    if (!writable.isEmpty()) {
      DispatchTask task =
          new DispatchTask(topicColumn, writable, plans, archiveCopies, deadLetterCopies, operation,
              writeMicros);
      JavaRDD<InternalRow> read = records.queryExecution().toRdd().toJavaRDD();
      boolean interpreted = TopicGroups.smallReads(read.rdd().partitions());
      if (read.getNumPartitions() > 1) {
        // A task per core at most, each topic read by as many tasks as its records are worth.
        read = read.rdd()
            .coalesce(Math.max(1, tasks), false, Option.apply(new TopicGroups(shares)), null)
            .toJavaRDD();
      }
      SparkContext sparkContext = spark.sparkContext();
      String mode = sparkContext.getLocalProperty(FACTORY_MODE);
      if (interpreted) {
        // Spark's Kafka source generates and looks up the code of its rows' projection for every partition
        // it reads, milliseconds each: a batch of many small partitions (many quiet topics) reads them
        // through Spark's interpreted projection instead. The rows' own plans stay compiled (TopicRows).
        sparkContext.setLocalProperty(FACTORY_MODE, "NO_CODEGEN");
      }
      try {
        for (Written part : read.mapPartitionsWithIndex(task, false).collect()) {
          outcomes.get(part.topic).add(part.counts);
          archiveFiles.get(part.topic).addAll(part.archive);
          deadLetterFiles.get(part.topic).addAll(part.deadLetters);
        }
      } finally {
        sparkContext.setLocalProperty(FACTORY_MODE, mode);
      }
    }
    for (int i = 0; i < count; i++) {
      TopicResult outcome = outcomes.get(i);
      for (DataFile file : archiveFiles.get(i)) {
        outcome.archiveFiles++;
        outcome.archiveBytes += file.fileSizeInBytes();
      }
      for (DataFile file : deadLetterFiles.get(i)) {
        outcome.deadLetterFiles++;
        outcome.deadLetterBytes += file.fileSizeInBytes();
      }
    }
    long wrote = System.nanoTime();
    return new BatchWrite(writes, outcomes, archiveTables, deadLetterTables, archiveFiles, deadLetterFiles,
        names, (planned - started) / 1_000_000, (wrote - planned) / 1_000_000);
  }

  private static Table load(SparkSession spark, String name) throws Exception {
    return name == null ? null : Spark3Util.loadIcebergTable(spark, name);
  }

  /**
   * Why this writer cannot write {@code rows} to {@code table}; null when it can: the table has the rows'
   * columns in their order (the rows are made in the table's order: bergstream.router.transform), and is
   * unsorted or sorted by the ingestion time alone, ascending (the order this writer gives each file;
   * another would be recorded in the files' metadata and not be true of them). Any partition spec.
   */
  private static String unwritable(
      Table table, String name, StructType rows, int metadata, RowLayout layout) {
    if (table == null) {
      return null;
    }
    StructType expected = SparkSchemaUtil.convert(table.schema());
    if (!sameNames(expected, rows)) {
      return name + "'s columns are " + expected.simpleString() + ", the rows' " + rows.simpleString();
    }
    SortOrder order = table.sortOrder();
    if (order.isSorted()) {
      StructType stamps = (StructType) rows.fields()[metadata].dataType();
      String ingestion = rows.fields()[metadata].name() + "." + stamps.fields()[layout.ingestion].name();
      SortField first = order.fields().get(0);
      boolean byIngestion = order.fields().size() == 1
          && first.transform().isIdentity()
          && first.direction() == SortDirection.ASC
          && ingestion.equals(table.schema().findColumnName(first.sourceId()));
      if (!byIngestion) {
        List<String> keys = new ArrayList<>();
        for (SortField field : order.fields()) {
          String column = table.schema().findColumnName(field.sourceId());
          keys.add((field.transform().isIdentity() ? column : field.transform() + "(" + column + ")") + " "
              + field.direction());
        }
        return name + " is sorted by " + String.join(", ", keys) + ", not by " + ingestion + " alone";
      }
    }
    return null;
  }

  private static boolean sameNames(StructType expected, StructType rows) {
    return expected.length() == rows.length()
        && java.util.Arrays.equals(expected.fieldNames(), rows.fieldNames())
        && expected.sameType(rows);
  }

}
