package io.bergstream.router;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.apache.iceberg.AppendFiles;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.SerializableTable;
import org.apache.iceberg.SortDirection;
import org.apache.iceberg.SortField;
import org.apache.iceberg.SortOrder;
import org.apache.iceberg.Table;
import org.apache.iceberg.relocated.com.google.common.util.concurrent.MoreExecutors;
import org.apache.iceberg.spark.Spark3Util;
import org.apache.iceberg.spark.SparkSchemaUtil;
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
  private static final ExecutorService SAME_THREAD = MoreExecutors.newDirectExecutorService();

  private TopicTables() {}

  static final long MICROS_PER_HOUR = 3_600_000_000L;
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
   * Writes and commits every topic's part of {@code records} (the micro-batch, whose column {@code
   * topicColumn} names each record's topic): {@code rows[i]} makes the rows of {@code topics[i]}'s
   * records, written into {@code archives[i]} and {@code deadLetters[i]}, each commit with {@code
   * properties[i]} in its snapshot summary and {@code writeMicros} as every row's router_write_ts. One
   * job of at most {@code tasks} tasks, a topic read by {@code shares.get(topic)} of them at most (one
   * when not named: TopicGroups), at most {@code threads} commits at once. A topic whose tables
   * cannot be written this way, or whose commit fails, has the reason in its outcome; the others are
   * committed regardless.
   */
  /**
   * What the tasks need of each plan and table, broadcast once and kept while they stay the same: a
   * closure holding hundreds of topics' plans and tables would be serialized, checked and shipped again
   * for every batch.
   */
  private static final Map<String, Map.Entry<String, Broadcast<TopicRows>>> PLANS =
      new ConcurrentHashMap<>();
  private static final Map<String, Map.Entry<String, Broadcast<Table>>> TABLES = new ConcurrentHashMap<>();

  private static Broadcast<TopicRows> plan(JavaSparkContext context, String topic, TopicRows rows) {
    Map.Entry<String, Broadcast<TopicRows>> known = PLANS.get(topic);
    if (known != null && known.getKey().equals(rows.id())) {
      return known.getValue();
    }
    Broadcast<TopicRows> made = context.broadcast(rows);
    PLANS.put(topic, Map.entry(rows.id(), made));
    if (known != null) {
      known.getValue().destroy(false);
    }
    return made;
  }

  private static Broadcast<Table> table(JavaSparkContext context, String name, Table table) {
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

  public static BatchWrite append(
      SparkSession spark,
      Dataset<Row> records,
      int topicColumn,
      List<String> topics,
      List<TopicRows> rows,
      List<String> archives,
      List<String> deadLetters,
      List<Map<String, String>> properties,
      long writeMicros,
      int tasks,
      Map<String, Integer> shares,
      int threads,
      List<String> keys)
      throws Exception {
    SecondWriters.Keys names =
        new SecondWriters.Keys(keys.get(0), keys.get(1), keys.get(2), keys.get(3), keys.get(4), keys.get(5));
    long started = System.nanoTime();
    int count = topics.size();
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
      TopicResult outcome = new TopicResult(topics.get(i));
      outcomes.add(outcome);
      archiveFiles.add(new ArrayList<>());
      deadLetterFiles.add(new ArrayList<>());
      // A table named null holds the batch already (a replay): its rows are counted, not written.
      Table archive = load(spark, archives.get(i));
      Table deadLetter = load(spark, deadLetters.get(i));
      archiveTables.add(archive);
      deadLetterTables.add(deadLetter);
      RowLayout layout = rows.get(i).layout();
      String refused =
          unwritable(archive, archives.get(i), rows.get(i).archiveType(), layout.archiveMetadata, layout);
      if (refused == null) {
        refused = unwritable(
            deadLetter, deadLetters.get(i), rows.get(i).deadLetterType(), layout.deadLetterMetadata, layout);
      }
      if (refused == null && archive != null) {
        // Another router of the topic: nothing is written, and the router stops (bergstream.router.archiver).
        outcome.secondWriter = SecondWriters.overlapping(archive, properties.get(i), names, false);
        refused = outcome.secondWriter == null ? null : "another router writes the topic";
      }
      plans.add(refused == null ? plan(context, topics.get(i), rows.get(i)) : null);
      archiveCopies.add(refused == null && archive != null ? table(context, archives.get(i), archive) : null);
      deadLetterCopies.add(
          refused == null && deadLetter != null ? table(context, deadLetters.get(i), deadLetter) : null);
      if (refused != null) {
        outcome.error = refused; // written on its own, by Spark's writer
      } else {
        writable.put(topics.get(i), i);
      }
    }
    long planned = System.nanoTime();
    if (!writable.isEmpty()) {
      DispatchTask task =
          new DispatchTask(topicColumn, writable, plans, archiveCopies, deadLetterCopies, operation,
              writeMicros);
      JavaRDD<InternalRow> read = records.queryExecution().toRdd().toJavaRDD();
      if (read.getNumPartitions() > 1) {
        // A task per core at most, each topic read by as many tasks as its records are worth.
        read = read.rdd()
            .coalesce(Math.max(1, tasks), false, Option.apply(new TopicGroups(shares)), null)
            .toJavaRDD();
      }
      for (Written part : read.mapPartitionsWithIndex(task, false).collect()) {
        outcomes.get(part.topic).add(part.counts);
        archiveFiles.get(part.topic).addAll(part.archive);
        deadLetterFiles.get(part.topic).addAll(part.deadLetters);
      }
    }
    long wrote = System.nanoTime();
    ExecutorService pool = Executors.newFixedThreadPool(Math.max(1, Math.min(threads, count)));
    try {
      List<Future<?>> commits = new ArrayList<>(count);
      for (int i = 0; i < count; i++) {
        int topic = i;
        if (outcomes.get(i).error != null) {
          continue;
        }
        commits.add(
            pool.submit(
                () -> {
                  TopicResult outcome = outcomes.get(topic);
                  try {
                    long began = System.nanoTime();
                    long[] archived = commit(archiveTables.get(topic), archiveFiles.get(topic),
                        properties.get(topic));
                    outcome.archiveFiles = archived[0];
                    outcome.archiveBytes = archived[1];
                    outcome.archiveCommitMicros = archived[0] > 0 ? (System.nanoTime() - began) / 1000 : 0;
                    if (archived[0] > 0) {
                      // Two routers committing at the same moment did not see each other before.
                      Table table = archiveTables.get(topic);
                      table.refresh();
                      outcome.secondWriter =
                          SecondWriters.overlapping(table, properties.get(topic), names, true);
                      outcome.committedBeside = outcome.secondWriter != null;
                    }
                    began = System.nanoTime();
                    long[] dead = commit(deadLetterTables.get(topic), deadLetterFiles.get(topic),
                        properties.get(topic));
                    outcome.deadLetterFiles = dead[0];
                    outcome.deadLetterBytes = dead[1];
                    outcome.deadLetterCommitMicros = dead[0] > 0 ? (System.nanoTime() - began) / 1000 : 0;
                  } catch (RuntimeException error) {
                    outcome.error = error.toString();
                    outcome.failure = error;
                  }
                }));
      }
      for (Future<?> commit : commits) {
        commit.get();
      }
    } finally {
      pool.shutdown();
    }
    long committed = System.nanoTime();
    return new BatchWrite(
        outcomes,
        (planned - started) / 1_000_000,
        (wrote - planned) / 1_000_000,
        (committed - wrote) / 1_000_000);
  }

  private static Table load(SparkSession spark, String name) throws Exception {
    return name == null ? null : Spark3Util.loadIcebergTable(spark, name);
  }

  /** Appends {@code files} with {@code properties}; {files, bytes}. No files: no snapshot. */
  private static long[] commit(Table table, List<DataFile> files, Map<String, String> properties) {
    if (files.isEmpty()) {
      return new long[] {0, 0};
    }
    // Many tables commit at once, each on a thread of its own: each writes its manifests and reads the
    // table's in that thread, instead of queueing them on Iceberg's shared pool of one thread per core and
    // polling for them (10 ms sleeps) while the pool serves the other commits.
    AppendFiles append =
        table.newAppend().scanManifestsWith(SAME_THREAD).writeManifestsWith(SAME_THREAD, 1);
    long bytes = 0;
    for (DataFile file : files) {
      append.appendFile(file);
      bytes += file.fileSizeInBytes();
    }
    properties.forEach(append::set);
    append.commit();
    return new long[] {files.size(), bytes};
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
