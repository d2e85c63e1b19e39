package io.bergstream.router;

import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.iceberg.AppendFiles;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.PartitionField;
import org.apache.iceberg.PartitionKey;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.Schema;
import org.apache.iceberg.SerializableTable;
import org.apache.iceberg.SortOrder;
import org.apache.iceberg.StructLike;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableProperties;
import org.apache.iceberg.deletes.EqualityDeleteWriter;
import org.apache.iceberg.deletes.PositionDeleteWriter;
import org.apache.iceberg.encryption.EncryptedOutputFile;
import org.apache.iceberg.io.DataWriter;
import org.apache.iceberg.io.FanoutDataWriter;
import org.apache.iceberg.io.FileWriterFactory;
import org.apache.iceberg.io.OutputFileFactory;
import org.apache.iceberg.parquet.Parquet;
import org.apache.iceberg.relocated.com.google.common.util.concurrent.MoreExecutors;
import org.apache.iceberg.spark.Spark3Util;
import org.apache.iceberg.spark.SparkSchemaUtil;
import org.apache.iceberg.spark.data.SparkParquetWriters;
import org.apache.iceberg.util.PropertyUtil;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.Function2;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The appends of many topics' tables in one micro-batch: one Spark job writes every topic's files, then
 * each table gets one commit, several at once.
 *
 * <p>A router of many topics in one query (`router run --pattern`) would otherwise run a Spark write job
 * and an Iceberg commit per table and batch, one after another: their fixed cost, not the records, would
 * bound how many topics a driver keeps up with. Here each topic's rows come as a frame of two structs,
 * {@code a} (the archive row, in the archive table's column order) and {@code d} (the dead letter, in the
 * dead-letter table's), exactly one of them set per record; every frame's partitions are tasks of the
 * same job. A task writes the archive rows and the dead letters of its part of one topic into Parquet
 * files of their tables' hours, sorted by ingestion time (the tables' order), with Iceberg's own Parquet
 * writer (more files when its rows pass its buffer, {@link #taskBufferBytes}), and counts what it read per
 * Kafka partition. The driver then appends each table's files with
 * the batch's snapshot properties: the archive table before the dead-letter table, as the router of one
 * topic does.
 */
public final class TopicTables {
  private static final ExecutorService SAME_THREAD = MoreExecutors.newDirectExecutorService();

  private TopicTables() {}

  private static final long MICROS_PER_HOUR = 3_600_000_000L;
  /** What a kept row costs beyond its bytes: its object, its array and its place in the list. */
  private static final long ROW_OVERHEAD = 64;
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

  /** What one topic's part of the batch came to, for its accounting. */
  public static final class Outcome implements Serializable {
    private static final long serialVersionUID = 1L;
    public final String topic;
    public long archived;
    public long deadLettered;
    public long archiveFiles;
    public long archiveBytes;
    public long deadLetterFiles;
    public long deadLetterBytes;
    /** How long each table's commit took, in microseconds; 0 for a table that had nothing to commit. */
    public long archiveCommitMicros;
    public long deadLetterCommitMicros;
    /** The newest ingestion time read, in microseconds; Long.MIN_VALUE when none. */
    public long newestMicros = Long.MIN_VALUE;
    /** Per Kafka partition: {records read, first offset, last offset}. */
    public final Map<Integer, long[]> partitions = new HashMap<>();
    /** Why the topic was not written, or its commits failed; null when they succeeded. */
    public String error;
    /** The failure of a commit, for a caller that waits it out; null when none (or the topic was refused). */
    transient RuntimeException failure;
    /**
     * Another router's commit covering offsets this batch covers (SecondWriters), found before the write
     * (the topic is not written) or, with {@link #committedBeside}, after its commit; null when none.
     */
    public String secondWriter;
    public boolean committedBeside;

    Outcome(String topic) {
      this.topic = topic;
    }

    void read(int partition, long offset) {
      long[] range = partitions.get(partition);
      if (range == null) {
        partitions.put(partition, new long[] {1, offset, offset});
      } else {
        range[0] += 1;
        range[1] = Math.min(range[1], offset);
        range[2] = Math.max(range[2], offset);
      }
    }

    void add(Outcome other) {
      archived += other.archived;
      deadLettered += other.deadLettered;
      newestMicros = Math.max(newestMicros, other.newestMicros);
      other.partitions.forEach(
          (partition, range) -> {
            long[] mine = partitions.get(partition);
            if (mine == null) {
              partitions.put(partition, range.clone());
            } else {
              mine[0] += range[0];
              mine[1] = Math.min(mine[1], range[1]);
              mine[2] = Math.max(mine[2], range[2]);
            }
          });
    }

    /**
     * {archived, dead-lettered, archive files and bytes, dead-letter files and bytes, newest micros, the
     * archive's and the dead letters' commit micros}.
     */
    public long[] totals() {
      return new long[] {
        archived, deadLettered, archiveFiles, archiveBytes, deadLetterFiles, deadLetterBytes, newestMicros,
        archiveCommitMicros, deadLetterCommitMicros
      };
    }
  }

  /** What a batch's write came to: each topic's outcome, and where its time went. */
  public static final class BatchWrite {
    private final List<Outcome> outcomes;
    private final long tablesMillis;
    private final long jobMillis;
    private final long commitMillis;

    BatchWrite(List<Outcome> outcomes, long tablesMillis, long jobMillis, long commitMillis) {
      this.outcomes = outcomes;
      this.tablesMillis = tablesMillis;
      this.jobMillis = jobMillis;
      this.commitMillis = commitMillis;
    }

    /**
     * Every topic's outcome as one JSON document, read by Python in one call instead of a dozen per topic:
     * [{"error", "totals": [archived, dead-lettered, archive files, archive bytes, dead-letter files,
     * dead-letter bytes, newest micros], "partitions": {partition: [read, first, last]}}, ...].
     */
    public String json() throws IOException {
      List<Map<String, Object>> listed = new ArrayList<>(outcomes.size());
      for (Outcome outcome : outcomes) {
        Map<String, Object> one = new HashMap<>();
        one.put("error", outcome.error);
        one.put("second_writer", outcome.secondWriter);
        one.put("committed_beside", outcome.committedBeside);
        one.put("totals", outcome.totals());
        one.put("partitions", outcome.partitions);
        listed.add(one);
      }
      return new ObjectMapper().writeValueAsString(listed);
    }

    /**
     * Throws the failure of topic {@code index}'s commit, if it had one, for a caller that tells an outage
     * from an error and waits the outage out; a topic refused before the write (its tables cannot be written
     * this way, another router's commit) has none.
     */
    public void rethrow(int index) {
      RuntimeException failure = outcomes.get(index).failure;
      if (failure != null) {
        throw failure;
      }
    }

    /** Milliseconds loading the tables and planning each topic's rows; the write job; the commits. */
    public long[] millis() {
      return new long[] {tablesMillis, jobMillis, commitMillis};
    }
  }

  /** What a task wrote: its topic's index, its files, its counts. */
  static final class Written implements Serializable {
    private static final long serialVersionUID = 1L;
    final int topic;
    final List<DataFile> archive;
    final List<DataFile> deadLetters;
    final Outcome counts;

    Written(int topic, List<DataFile> archive, List<DataFile> deadLetters, Outcome counts) {
      this.topic = topic;
      this.archive = archive;
      this.deadLetters = deadLetters;
      this.counts = counts;
    }
  }

  /**
   * Writes and commits every topic's part of {@code records} (the micro-batch, whose column {@code
   * topicColumn} names each record's topic): {@code rows[i]} makes the rows of {@code topics[i]}'s
   * records, written into {@code archives[i]} and {@code deadLetters[i]}, each commit with {@code
   * properties[i]} in its snapshot summary and {@code writeMicros} as every row's router_write_ts. One
   * job of at most {@code tasks} tasks, at most {@code threads} commits at once. A topic whose tables
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
      int threads,
      List<String> keys)
      throws Exception {
    SecondWriters.Keys names =
        new SecondWriters.Keys(keys.get(0), keys.get(1), keys.get(2), keys.get(3), keys.get(4), keys.get(5));
    long started = System.nanoTime();
    int count = topics.size();
    List<Table> archiveTables = new ArrayList<>(count);
    List<Table> deadLetterTables = new ArrayList<>(count);
    List<Outcome> outcomes = new ArrayList<>(count);
    List<List<DataFile>> archiveFiles = new ArrayList<>(count);
    List<List<DataFile>> deadLetterFiles = new ArrayList<>(count);
    Map<String, Integer> writable = new HashMap<>();
    JavaSparkContext context = JavaSparkContext.fromSparkContext(spark.sparkContext());
    List<Broadcast<TopicRows>> plans = new ArrayList<>(count);
    List<Broadcast<Table>> archiveCopies = new ArrayList<>(count);
    List<Broadcast<Table>> deadLetterCopies = new ArrayList<>(count);
    String operation = UUID.randomUUID().toString();
    for (int i = 0; i < count; i++) {
      Outcome outcome = new Outcome(topics.get(i));
      outcomes.add(outcome);
      archiveFiles.add(new ArrayList<>());
      deadLetterFiles.add(new ArrayList<>());
      // A table named null holds the batch already (a replay): its rows are counted, not written.
      Table archive = load(spark, archives.get(i));
      Table deadLetter = load(spark, deadLetters.get(i));
      archiveTables.add(archive);
      deadLetterTables.add(deadLetter);
      String refused = unwritable(archive, archives.get(i), rows.get(i).archiveType());
      if (refused == null) {
        refused = unwritable(deadLetter, deadLetters.get(i), rows.get(i).deadLetterType());
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
      int partitions = read.getNumPartitions();
      if (partitions > tasks) {
        read = read.coalesce(Math.max(1, tasks), false);
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
                  Outcome outcome = outcomes.get(topic);
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
   * Why this writer cannot write {@code rows} to {@code table}; null when it can: the table is partitioned
   * by the hour of the ingestion time alone, as bergstream makes it, and has the rows' columns in their
   * order.
   */
  private static String unwritable(Table table, String name, StructType rows) {
    if (table == null) {
      return null;
    }
    List<PartitionField> fields = table.spec().fields();
    if (fields.size() != 1 || !fields.get(0).transform().toString().equals("hour")) {
      return name + " is not partitioned by the hour of its ingestion time alone";
    }
    StructType expected = SparkSchemaUtil.convert(table.schema());
    if (!sameNames(expected, rows)) {
      return name + "'s columns are " + expected.simpleString() + ", the rows' " + rows.simpleString();
    }
    return null;
  }

  private static boolean sameNames(StructType expected, StructType rows) {
    return expected.length() == rows.length()
        && java.util.Arrays.equals(expected.fieldNames(), rows.fieldNames())
        && expected.sameType(rows);
  }

  /** A task's writing: each record of its part of the batch into its topic's rows and files. */
  static final class DispatchTask
      implements Function2<Integer, Iterator<InternalRow>, Iterator<Written>> {
    private static final long serialVersionUID = 1L;
    private final int topicColumn;
    private final Map<String, Integer> topics;
    private final List<Broadcast<TopicRows>> rows;
    private final List<Broadcast<Table>> archives;
    private final List<Broadcast<Table>> deadLetters;
    private final String operation;
    private final long writeMicros;

    DispatchTask(int topicColumn, Map<String, Integer> topics, List<Broadcast<TopicRows>> rows,
        List<Broadcast<Table>> archives, List<Broadcast<Table>> deadLetters, String operation,
        long writeMicros) {
      this.topicColumn = topicColumn;
      this.topics = new HashMap<>(topics);
      this.rows = new ArrayList<>(rows);
      this.archives = new ArrayList<>(archives);
      this.deadLetters = new ArrayList<>(deadLetters);
      this.operation = operation;
      this.writeMicros = writeMicros;
    }

    @Override
    public Iterator<Written> call(Integer partition, Iterator<InternalRow> records) throws IOException {
      Map<Integer, Part> parts = new HashMap<>();
      TaskContext context = TaskContext.get();
      long taskId = context == null ? 0 : context.taskAttemptId();
      UTF8String lastName = null;
      Part last = null;
      long buffered = 0;
      long bufferBytes = taskBufferBytes();
      while (records.hasNext()) {
        InternalRow record = records.next();
        UTF8String name = record.getUTF8String(topicColumn);
        if (lastName == null || !lastName.equals(name)) {
          lastName = name.clone();
          Integer index = topics.get(name.toString());
          last =
              index == null
                  ? null
                  : parts.computeIfAbsent(
                      index,
                      i -> new Part(i, rows.get(i).value(), partition, archives.get(i) != null,
                          deadLetters.get(i) != null));
        }
        if (last != null) {
          buffered += last.add(TopicRows.apply(last.projections, record), writeMicros);
          if (buffered > bufferBytes) {
            // The task's rows are held until written, sorted: past its share of memory, every topic's
            // rows so far go to files of their own (each file still one hour, in ingestion order).
            for (Part part : parts.values()) {
              flush(part, partition, taskId);
            }
            buffered = 0;
          }
        }
      }
      List<Written> written = new ArrayList<>(parts.size());
      for (Part part : parts.values()) {
        flush(part, partition, taskId);
        written.add(new Written(part.index, part.archiveFiles, part.deadLetterFiles, part.counts));
      }
      return written.iterator();
    }

    private void flush(Part part, int partition, long taskId) throws IOException {
      int index = part.index;
      if (part.keepArchive) {
        Table archive = archives.get(index).value();
        if (part.archiveNames == null) {
          // One namer per table and task: the files of each flush are numbered on from the last one's.
          part.archiveNames = files(archive, partition, taskId);
        }
        part.archiveFiles.addAll(write(archive, part.archiveNames, part.rows.archiveType(), part.archived,
            part.rows.layout(), part.rows.layout().archiveMetadata));
      }
      if (part.keepDeadLetters) {
        Table deadLetter = deadLetters.get(index).value();
        if (part.deadLetterNames == null) {
          part.deadLetterNames = files(deadLetter, partition, taskId);
        }
        part.deadLetterFiles.addAll(write(deadLetter, part.deadLetterNames, part.rows.deadLetterType(),
            part.dead, part.rows.layout(), part.rows.layout().deadLetterMetadata));
      }
      part.archived.clear();
      part.dead.clear();
    }

    private OutputFileFactory files(Table table, int partition, long taskId) {
      return OutputFileFactory.builderFor(table, partition, taskId)
          .format(FileFormat.PARQUET)
          .operationId(operation)
          .build();
    }

    /** One topic's rows in this task. */
    private static final class Part {
      final int index;
      final TopicRows rows;
      final List<UnsafeProjection> projections;
      final Outcome counts = new Outcome("");
      final List<InternalRow> archived = new ArrayList<>();
      final List<InternalRow> dead = new ArrayList<>();
      final List<DataFile> archiveFiles = new ArrayList<>();
      final List<DataFile> deadLetterFiles = new ArrayList<>();
      // False for a table that holds the batch already: its rows are counted, not kept.
      final boolean keepArchive;
      final boolean keepDeadLetters;
      OutputFileFactory archiveNames;
      OutputFileFactory deadLetterNames;

      Part(int index, TopicRows rows, int partition, boolean keepArchive, boolean keepDeadLetters) {
        this.index = index;
        this.rows = rows;
        this.projections = rows.projections(partition);
        this.keepArchive = keepArchive;
        this.keepDeadLetters = keepDeadLetters;
      }

      /**
       * Counts the record and keeps its row for its table, unless that table holds the batch already;
       * returns the bytes it holds.
       */
      long add(InternalRow row, long writeMicros) {
        RowLayout layout = rows.layout();
        boolean archive = !row.isNullAt(0);
        InternalRow kept =
            archive
                ? row.getStruct(0, rows.archiveType().length())
                : row.getStruct(1, rows.deadLetterType().length());
        boolean keep = archive ? keepArchive : keepDeadLetters;
        if (keep) {
          kept = kept.copy();
          (archive ? archived : dead).add(kept);
        }
        if (archive) {
          counts.archived++;
        } else {
          counts.deadLettered++;
        }
        InternalRow metadata =
            kept.getStruct(archive ? layout.archiveMetadata : layout.deadLetterMetadata, layout.metadataFields);
        // One time for the whole batch, as the router of one topic stamps it.
        metadata.setLong(layout.writeTime, writeMicros);
        counts.read(metadata.getInt(layout.partition), metadata.getLong(layout.offset));
        counts.newestMicros = Math.max(counts.newestMicros, metadata.getLong(layout.ingestion));
        if (!keep) {
          return 0;
        }
        return kept instanceof UnsafeRow unsafe ? unsafe.getSizeInBytes() + ROW_OVERHEAD : ROW_OVERHEAD;
      }
    }

    private List<DataFile> write(Table table, OutputFileFactory files, StructType type,
        List<InternalRow> rows, RowLayout layout, int metadata) throws IOException {
      if (rows.isEmpty()) {
        return List.of();
      }
      int fields = layout.metadataFields;
      int ingestion = layout.ingestion;
      Comparator<InternalRow> byIngestion =
          Comparator.comparingLong(row -> row.getStruct(metadata, fields).getLong(ingestion));
      rows.sort(byIngestion);
      long targetSize =
          PropertyUtil.propertyAsLong(
              table.properties(),
              TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
              TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT);
      PartitionSpec spec = table.spec();
      PartitionKey key = new PartitionKey(spec, table.schema());
      FanoutDataWriter<InternalRow> writer =
          new FanoutDataWriter<>(new ParquetRows(table, type), files, table.io(), targetSize);
      try {
        for (InternalRow row : rows) {
          long micros = row.getStruct(metadata, fields).getLong(ingestion);
          key.set(0, (int) Math.floorDiv(micros, MICROS_PER_HOUR));
          writer.write(row, spec, key);
        }
      } finally {
        writer.close();
      }
      return writer.result().dataFiles();
    }
  }

  /** Iceberg's Parquet data files of a table, from Spark's internal rows of its columns. */
  static final class ParquetRows implements FileWriterFactory<InternalRow>, Serializable {
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
}
