package io.bergstream.router;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.SortedMap;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.iceberg.AppendFiles;
import org.apache.iceberg.ContentFileParser;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.HasTableOperations;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.JsonNode;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.node.ArrayNode;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.iceberg.spark.Spark3Util;
import org.apache.iceberg.util.JsonUtil;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;

/**
 * The data files an earlier version of the router wrote and had not committed yet, per table and batch, as it
 * recorded them beside a query's checkpoint, a record per batch: a driver started on such a checkpoint reads
 * them ({@link #load}) and commits each of them once ({@link #flush}), before anything new. Today's router
 * commits every batch it writes and records no files.
 *
 * <p>A record is one JSON document, {"batch": N, "query": id, "tables": {table: {..., "files": [...]}}}:
 * what the driver said of each table (its topic, the range of the batch, its counts) with the table's files
 * of that batch in Iceberg's own JSON form of a data file (ContentFileParser), written to a file of its own
 * and renamed into place. Each table's entry names the table's Iceberg uuid too: files written for a table
 * are committed into that table alone, never into another made under its name since (dropped and made again
 * while the driver was stopped), whose columns and partitions may be numbered otherwise; {@link #load} says
 * which tables are another or gone ("replaced").
 */
public final class PendingFiles {
  private static final ObjectMapper JSON = JsonUtil.mapper();
  final Map<String, SortedMap<Long, List<DataFile>>> files = new ConcurrentHashMap<>();
  final Map<String, Map<Integer, PartitionSpec>> specs = new ConcurrentHashMap<>();
  final Map<String, String> uuids = new ConcurrentHashMap<>();

  /** Keeps {@code written}, the files of {@code table} written by batch {@code batch}, as read back. */
  synchronized void keep(String name, Table table, long batch, List<DataFile> written) {
    if (written.isEmpty()) {
      return;
    }
    specs.put(name, table.specs());
    uuids.put(name, table.uuid().toString());
    files.computeIfAbsent(name, n -> new TreeMap<>()).merge(batch, new ArrayList<>(written), (a, b) -> {
      // The same batch written again (a replay that found its record): the later attempt's files.
      return b;
    });
  }

  /** The files of {@code table} of batches up to {@code batch} are committed: no longer pending. */
  public synchronized void committed(String table, long batch) {
    SortedMap<Long, List<DataFile>> batches = files.get(table);
    if (batches == null) {
      return;
    }
    batches.headMap(batch + 1).clear();
    if (batches.isEmpty()) {
      files.remove(table);
    }
  }

  /** The batches of {@code table} with files pending, oldest first. */
  public synchronized long[] batches(String table) {
    SortedMap<Long, List<DataFile>> batches = files.get(table);
    return batches == null ? new long[0] : batches.keySet().stream().mapToLong(Long::longValue).toArray();
  }

  /**
   * Reads every record in {@code directory} (none when it does not exist), keeps their files, and returns
   * the records as the driver wrote them, with each table's file count in place of its files, oldest batch
   * first: [{"batch", "query", "path", "tables": {table: {..., "files": count}}}]. A table that does not
   * exist, or that is another table than the one its files were written for (another uuid), has its files
   * left out and says why in "replaced". A record written before uuids were recorded is taken as is.
   */
  public synchronized String load(SparkSession spark, String directory) throws Exception {
    Path folder = new Path(directory);
    FileSystem fs = folder.getFileSystem(spark.sparkContext().hadoopConfiguration());
    ArrayNode loaded = JSON.createArrayNode();
    if (!fs.exists(folder)) {
      return JSON.writeValueAsString(loaded);
    }
    TreeMap<Long, ObjectNode> records = new TreeMap<>();
    for (FileStatus status : fs.listStatus(folder)) {
      String name = status.getPath().getName();
      if (!name.endsWith(".json")) {
        continue; // a record never renamed into place: its batch was not done
      }
      ObjectNode record;
      try (InputStream in = fs.open(status.getPath())) {
        record = (ObjectNode) JSON.readTree(new String(in.readAllBytes(), StandardCharsets.UTF_8));
      } catch (IOException | ClassCastException error) {
        throw new IOException(status.getPath() + " is not a record of files pending: " + error, error);
      }
      record.put("path", status.getPath().toString());
      records.put(record.get("batch").asLong(), record);
    }
    for (ObjectNode record : records.values()) {
      long batch = record.get("batch").asLong();
      Iterator<Map.Entry<String, JsonNode>> tables = record.get("tables").fields();
      while (tables.hasNext()) {
        Map.Entry<String, JsonNode> table = tables.next();
        ObjectNode entry = (ObjectNode) table.getValue();
        Table loadedTable;
        try {
          loadedTable = Spark3Util.loadIcebergTable(spark, table.getKey());
        } catch (NoSuchTableException error) {
          replaced(entry, "table " + table.getKey() + " does not exist: dropped");
          continue;
        }
        String written = entry.hasNonNull("uuid") ? entry.get("uuid").asText() : null;
        String current = loadedTable.uuid().toString();
        if (written != null && !written.equals(current)) {
          replaced(entry, "table " + table.getKey() + " is another table than the one its files were written"
              + " for (uuid " + current + ", not " + written + "): dropped and made again");
          continue;
        }
        List<DataFile> read = new ArrayList<>();
        for (JsonNode file : entry.get("files")) {
          read.add((DataFile) ContentFileParser.fromJson(file, loadedTable.specs()));
        }
        keep(table.getKey(), loadedTable, batch, read);
        entry.put("files", read.size());
      }
      loaded.add(record);
    }
    return JSON.writeValueAsString(loaded);
  }

  private static void replaced(ObjectNode entry, String why) {
    entry.put("files", entry.get("files").size());
    entry.put("replaced", why);
  }

  /** Deletes the record at {@code path}, if it is there. */
  public static void delete(SparkSession spark, String path) throws IOException {
    Path target = new Path(path);
    FileSystem fs = target.getFileSystem(spark.sparkContext().hadoopConfiguration());
    fs.delete(target, false);
  }

  /**
   * Commits the files of {@code name} pending up to {@code batch}, alone, with {@code properties} in the
   * snapshot's summary: those of the batches its history does not hold yet (a commit before the driver
   * stopped, its record not cleared, holds them). {files, bytes, micros}; {-1, 0, 0} when it held them all.
   * Whether they are all still there is {@link #missing}'s to say, before a driver started again commits.
   */
  public long[] flush(SparkSession spark, String name, String queryKey, String batchKey, long batch,
      Map<String, String> properties) throws Exception {
    long began = System.nanoTime();
    Table table = Spark3Util.loadIcebergTable(spark, name);
    long newest = newestBatch(table, queryKey, batchKey, properties.get(queryKey));
    List<DataFile> all = after(name, newest, batch);
    if (all.isEmpty()) {
      committed(name, batch);
      return new long[] {newest >= batch ? -1 : 0, 0, 0};
    }
    long[] appended = append(table, all, properties);
    committed(name, batch);
    return new long[] {appended[0], appended[1], (System.nanoTime() - began) / 1000};
  }

  /**
   * How many of the files of {@code name} pending up to {@code batch} are gone from storage (removed as
   * orphans while the driver was stopped); after a check of each, none when the table holds that batch.
   */
  public long missing(SparkSession spark, String name, String queryKey, String batchKey, long batch,
      String query) throws Exception {
    Table table = Spark3Util.loadIcebergTable(spark, name);
    return after(name, newestBatch(table, queryKey, batchKey, query), batch).stream()
        .filter(file -> !table.io().newInputFile(file.location()).exists())
        .count();
  }

  /**
   * The files of {@code name} of the batches after {@code newest} (the table's newest batch of the query:
   * what its history holds already) up to {@code batch}. A record names a table's files until every table
   * it names is committed: its batches the table holds are not committed again.
   */
  private synchronized List<DataFile> after(String name, long newest, long batch) {
    List<DataFile> all = new ArrayList<>();
    SortedMap<Long, List<DataFile>> batches = files.get(name);
    if (batches != null && batch > newest) {
      batches.subMap(newest + 1, batch + 1).values().forEach(all::addAll);
    }
    return all;
  }

  /**
   * The size of {@code table}'s current metadata file, which every commit writes whole: it grows with the
   * snapshots kept. 0 where the table keeps none (a catalog that holds its metadata itself).
   */
  static long metadataBytes(Table table) {
    if (!(table instanceof HasTableOperations operations)) {
      return 0;
    }
    String location = operations.operations().current().metadataFileLocation();
    return location == null ? 0 : table.io().newInputFile(location).getLength();
  }

  /** The newest batch of query {@code query} in {@code table}'s current history; -1 when none. */
  static long newestBatch(Table table, String queryKey, String batchKey, String query) {
    Snapshot snapshot = table.currentSnapshot();
    while (snapshot != null) {
      Map<String, String> summary = snapshot.summary();
      if (query.equals(summary.get(queryKey)) && summary.get(batchKey) != null) {
        return Long.parseLong(summary.get(batchKey));
      }
      Long parent = snapshot.parentId();
      snapshot = parent == null ? null : table.snapshot(parent);
    }
    return -1;
  }

  /** Appends {@code files} with {@code properties}; {files, bytes}. No files: no snapshot. */
  static long[] append(Table table, List<DataFile> files, Map<String, String> properties) {
    if (files.isEmpty()) {
      return new long[] {0, 0};
    }
    // Many tables commit at once, each on a thread of its own: each writes its manifests and reads the
    // table's in that thread, instead of queueing them on Iceberg's shared pool of one thread per core and
    // polling for them (10 ms sleeps) while the pool serves the other commits.
    AppendFiles append =
        table.newAppend().scanManifestsWith(TopicTables.SAME_THREAD).writeManifestsWith(TopicTables.SAME_THREAD, 1);
    long bytes = 0;
    for (DataFile file : files) {
      append.appendFile(file);
      bytes += file.fileSizeInBytes();
    }
    properties.forEach(append::set);
    append.commit();
    return new long[] {files.size(), bytes};
  }
}
