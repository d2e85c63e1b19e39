package io.bergstream.router;

import java.io.IOException;
import java.io.OutputStream;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.SortedMap;
import java.util.TreeMap;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.iceberg.ContentFileParser;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.Table;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.JsonNode;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.node.ArrayNode;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.iceberg.util.JsonUtil;
import org.apache.spark.sql.SparkSession;

/**
 * Files pending as an earlier version of the router kept them: a batch's files written and not committed,
 * and the record of them it wrote beside the query's checkpoint, in its format, for the tests of their
 * recovery at start ({@link PendingFiles#load}, {@link PendingFiles#flush}).
 */
final class EarlierPending {
  private static final ObjectMapper JSON = JsonUtil.mapper();

  private EarlierPending() {}

  /** Keeps the files topic {@code index} of {@code written} wrote as pending in {@code pending}. */
  static void hold(PendingFiles pending, BatchWrite written, long batch, int index) {
    TopicWrite topic = written.writes.get(index);
    if (topic.writtenArchive() != null) {
      keep(pending, topic.archive, written.archives.get(index), batch, written.archiveFiles.get(index));
    }
    if (topic.writtenDeadLetters() != null) {
      keep(pending, topic.deadLetters, written.deadLetters.get(index), batch,
          written.deadLetterFiles.get(index));
    }
  }

  private static void keep(PendingFiles pending, String name, Table table, long batch, List<DataFile> files) {
    if (files.isEmpty()) {
      return;
    }
    pending.specs.put(name, table.specs());
    pending.uuids.put(name, table.uuid().toString());
    pending.files.computeIfAbsent(name, n -> new TreeMap<>()).put(batch, List.copyOf(files));
  }

  /**
   * Writes the record of batch {@code batch} at {@code path}: {@code document} ({"batch", "query",
   * "tables": {table: {...}}}) with each table's uuid and its files of that batch added, renamed into place.
   */
  static void record(PendingFiles pending, SparkSession spark, String path, String document)
      throws IOException {
    ObjectNode record = (ObjectNode) JSON.readTree(document);
    long batch = record.get("batch").asLong();
    Iterator<Map.Entry<String, JsonNode>> tables = record.get("tables").fields();
    while (tables.hasNext()) {
      Map.Entry<String, JsonNode> table = tables.next();
      ObjectNode entry = (ObjectNode) table.getValue();
      String uuid = pending.uuids.get(table.getKey());
      if (uuid != null) {
        entry.put("uuid", uuid);
      }
      ArrayNode listed = entry.putArray("files");
      SortedMap<Long, List<DataFile>> batches = pending.files.get(table.getKey());
      List<DataFile> files = batches == null ? List.of() : batches.getOrDefault(batch, List.of());
      Map<Integer, PartitionSpec> known = pending.specs.get(table.getKey());
      for (DataFile file : files) {
        listed.add(JSON.readTree(ContentFileParser.toJson(file, known.get(file.specId()))));
      }
    }
    Path target = new Path(path);
    FileSystem fs = target.getFileSystem(spark.sparkContext().hadoopConfiguration());
    Path written = target.suffix(".tmp");
    try (OutputStream out = fs.create(written, true)) {
      out.write(JSON.writeValueAsBytes(record));
    }
    if (!fs.rename(written, target)) {
      throw new IOException("cannot write " + path + ": renaming " + written + " over it failed");
    }
  }
}
