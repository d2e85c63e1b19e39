package io.bergstream.router;

import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.PartitionKey;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableProperties;
import org.apache.iceberg.io.FanoutDataWriter;
import org.apache.iceberg.io.OutputFileFactory;
import org.apache.iceberg.util.PropertyUtil;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.Function2;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/** A task's writing: each record of its part of the batch into its topic's rows and files. */
final class DispatchTask
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
    long bufferBytes = TopicTables.taskBufferBytes();
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
        .format(TableFiles.format(table))
        .operationId(operation)
        .build();
  }

  /** One topic's rows in this task. */
  private static final class Part {
    final int index;
    final TopicRows rows;
    final List<UnsafeProjection> projections;
    final TopicResult counts = new TopicResult("");
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
      long ingested = metadata.getLong(layout.ingestion);
      counts.newestMicros = Math.max(counts.newestMicros, ingested);
      counts.oldestMicros = Math.min(counts.oldestMicros, ingested);
      if (!keep) {
        return 0;
      }
      return kept instanceof UnsafeRow unsafe ? unsafe.getSizeInBytes() + TopicTables.ROW_OVERHEAD : TopicTables.ROW_OVERHEAD;
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
    // The tables bergstream makes: the hour of the ingestion time, read straight from the row. Any other
    // spec: its transforms of the row's values, as Spark's writer computes them.
    boolean byIngestionHour = byIngestionHour(spec, table, type, metadata, layout);
    RowStruct view = byIngestionHour ? null : new RowStruct(table.schema().asStruct());
    FanoutDataWriter<InternalRow> writer =
        new FanoutDataWriter<>(new TableFiles(table, type), files, table.io(), targetSize);
    try {
      for (InternalRow row : rows) {
        if (byIngestionHour) {
          long micros = row.getStruct(metadata, fields).getLong(ingestion);
          key.set(0, (int) Math.floorDiv(micros, TopicTables.MICROS_PER_HOUR));
        } else {
          key.partition(view.wrap(row));
        }
        writer.write(row, spec, key);
      }
    } finally {
      writer.close();
    }
    return writer.result().dataFiles();
  }

  /** Whether {@code spec} is the hour of the rows' ingestion time alone, as bergstream makes its tables. */
  static boolean byIngestionHour(
      PartitionSpec spec, Table table, StructType type, int metadata, RowLayout layout) {
    if (spec.fields().size() != 1 || !spec.fields().get(0).transform().toString().equals("hour")) {
      return false;
    }
    StructType stamps = (StructType) type.fields()[metadata].dataType();
    String ingestion = type.fields()[metadata].name() + "." + stamps.fields()[layout.ingestion].name();
    return ingestion.equals(table.schema().findColumnName(spec.fields().get(0).sourceId()));
  }
}

/** What a task wrote: its topic's index, its files, its counts. */
final class Written implements Serializable {
  private static final long serialVersionUID = 1L;
  final int topic;
  final List<DataFile> archive;
  final List<DataFile> deadLetters;
  final TopicResult counts;

  Written(int topic, List<DataFile> archive, List<DataFile> deadLetters, TopicResult counts) {
    this.topic = topic;
    this.archive = archive;
    this.deadLetters = deadLetters;
    this.counts = counts;
  }
}
