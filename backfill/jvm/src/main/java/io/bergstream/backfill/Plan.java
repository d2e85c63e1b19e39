package io.bergstream.backfill;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.InputStream;
import java.io.Serializable;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;

/**
 * What one backfill source reads, as the Python planner wrote it: the table at its pinned snapshot,
 * the regions, and the epochs shared by every source of the backfill ([lower, upper) ingestion times in
 * microseconds, ascending). A plan for {@code bergstream-hybrid} adds the {@link Handover}: the Kafka
 * positions recorded in that snapshot, where the source reads on from Kafka once the epochs are done.
 */
final class Plan implements Serializable {
  private static final long serialVersionUID = 1L;
  static final int FORMAT = 1;

  final String path;
  final String source;
  final String table;
  final Long snapshotId;
  final List<String> regions;
  final long windowStart;
  final long windowEnd;
  final long[][] epochs;
  // Passed to Iceberg's scan of each epoch (split-size, ...), over the source's own.
  final Map<String, String> readOptions;
  // Exact ingestion-time order: one reader merges each epoch instead of every split in parallel.
  final boolean singleReader;
  // Per data file with several row groups: each group's position (the byte offset by which Iceberg's
  // Parquet reader gives it to the split whose range holds it, its midpoint) and inclusive ingestion-time
  // bounds, so that an epoch's splits reading only groups outside it are never scheduled.
  final Map<String, long[][]> rowGroups;
  // Per data file: its inclusive ingestion-time bounds, as the planner found them.
  final Map<String, long[]> files;
  // Where Kafka takes over from the archive; null in a plan for bergstream-backfill alone.
  final Handover handover;
  // The archive row's type as the first run found it at the snapshot, given once the source has switched to
  // Kafka: the archive is read no more, and its snapshot, released, may have expired. Null before.
  final StructType archiveSchema;

  private Plan(String path, JsonNode node) {
    this.path = path;
    this.source = node.path("source").asText("backfill");
    this.table = required(node, "table").asText();
    this.snapshotId = node.path("snapshot_id").isNumber() ? node.get("snapshot_id").asLong() : null;
    List<String> wanted = null;
    if (node.path("regions").isArray()) {
      wanted = new ArrayList<>();
      for (JsonNode region : node.get("regions")) {
        wanted.add(region.asText());
      }
    }
    this.handover = node.hasNonNull("handover") ? Handover.of(node.get("handover")) : null;
    if (handover != null) {
      if (snapshotId == null || snapshotId != handover.snapshotId) {
        throw new IllegalArgumentException(
            "the hand-over offsets were recorded by snapshot " + handover.snapshotId + ", but the table is"
                + " read at snapshot " + snapshotId + ": the archive is read where its Kafka positions were"
                + " recorded");
      }
      // Kafka is one cluster: the archive phase reads only the rows read from it, or rows of other
      // regions would be read from the archive and never from Kafka.
      if (wanted == null) {
        wanted = List.of(handover.cluster);
      } else if (!wanted.equals(List.of(handover.cluster))) {
        throw new IllegalArgumentException(
            "regions " + wanted + " are read from the archive, but Kafka takes over from cluster "
                + handover.cluster + " alone");
      }
    }
    this.regions = wanted;
    if (node.hasNonNull("archive_schema")) {
      if (handover == null) {
        throw new IllegalArgumentException(
            "archive_schema is kept for the Kafka phase of a plan with a hand-over, and this one has none");
      }
      DataType archived = DataType.fromJson(node.get("archive_schema").toString());
      if (!(archived instanceof StructType struct)) {
        throw new IllegalArgumentException("archive_schema is not a struct: " + archived.simpleString());
      }
      this.archiveSchema = struct;
    } else {
      this.archiveSchema = null;
    }
    Map<String, String> options = new HashMap<>();
    node.path("read_options").fields().forEachRemaining(e -> options.put(e.getKey(), e.getValue().asText()));
    this.readOptions = options;
    this.singleReader = node.path("single_reader").asBoolean(false);
    Map<String, long[][]> groups = new HashMap<>();
    node.path("row_groups").fields().forEachRemaining(file -> {
      long[][] bounds = new long[file.getValue().size()][];
      for (int i = 0; i < bounds.length; i++) {
        JsonNode group = file.getValue().get(i);
        bounds[i] = new long[] {group.get(0).asLong(), group.get(1).asLong(), group.get(2).asLong()};
      }
      groups.put(file.getKey(), bounds);
    });
    this.rowGroups = groups;
    Map<String, long[]> bounds = new HashMap<>();
    node.path("files").fields().forEachRemaining(
        file -> bounds.put(file.getKey(), new long[] {file.getValue().get(0).asLong(), file.getValue().get(1).asLong()}));
    this.files = bounds;
    JsonNode window = required(node, "window");
    this.windowStart = window.get(0).asLong();
    this.windowEnd = window.get(1).asLong();
    JsonNode list = required(node, "epochs");
    this.epochs = new long[list.size()][];
    long previous = Long.MIN_VALUE;
    for (int i = 0; i < list.size(); i++) {
      long lower = list.get(i).get(0).asLong();
      long upper = list.get(i).get(1).asLong();
      if (lower >= upper || lower < previous || lower < windowStart || upper > windowEnd) {
        throw new IllegalArgumentException(
            "backfill plan " + path + ": epoch " + i + " [" + lower + ", " + upper
                + ") is empty, out of order or outside the window");
      }
      previous = upper;
      this.epochs[i] = new long[] {lower, upper};
    }
  }

  private static JsonNode required(JsonNode node, String key) {
    if (!node.hasNonNull(key)) {
      throw new IllegalArgumentException("backfill plan has no '" + key + "'");
    }
    return node.get(key);
  }

  static Plan read(String path) {
    return read(path, "bergstream-backfill");
  }

  /**
   * The plan file at `path`, for the source `format` (named in the message when the option is missing).
   * Read through Hadoop's FileSystem with the session's configuration, as the checkpoint it lies beside:
   * a checkpoint on S3 or HDFS has its plan there.
   */
  static Plan read(String path, String format) {
    if (path == null || path.isEmpty()) {
      throw new IllegalArgumentException(
          "the " + format + " source needs option 'plan': the plan file bergstream writes");
    }
    try {
      Path file = new Path(path);
      FileSystem fs = file.getFileSystem(SparkSession.active().sessionState().newHadoopConf());
      JsonNode node;
      try (InputStream in = fs.open(file)) {
        node = new ObjectMapper().readTree(in);
      }
      if (node.path("format").asInt() != FORMAT) {
        throw new IllegalArgumentException(
            "backfill plan " + path + " has format " + node.path("format") + ", not " + FORMAT);
      }
      return new Plan(path, node);
    } catch (IOException e) {
      throw new IllegalArgumentException("cannot read backfill plan " + path + ": " + e.getMessage(), e);
    } catch (IllegalArgumentException e) {
      throw new IllegalArgumentException("backfill plan " + path + ": " + e.getMessage(), e);
    }
  }

  /**
   * Whether the split [start, start + length) of `file` may read rows of [lower, upper): false only
   * when the file's bounds, or those of every row group the reader gives that split, lie outside it.
   */
  boolean mayHold(String file, long start, long length, long lower, long upper) {
    long[] bounds = files.get(file);
    if (bounds != null && (bounds[0] >= upper || bounds[1] < lower)) {
      return false;
    }
    long[][] groups = rowGroups.get(file);
    if (groups == null) {
      return true;
    }
    boolean any = false;
    for (long[] group : groups) {
      if (group[0] >= start && group[0] < start + length) {
        any = true;
        if (group[1] < upper && group[2] >= lower) {
          return true;
        }
      }
    }
    return !any;
  }

  /**
   * Whether the row groups that the split [start, start + length) of `file` reads span more ingestion
   * time than `width`: then a row group of it holds rows well outside an epoch of that width, and
   * Parquet's page statistics can skip them. Unknown bounds count as wide.
   */
  boolean widerThan(String file, long start, long length, long width) {
    long[][] groups = rowGroups.get(file);
    if (groups == null) {
      long[] bounds = files.get(file);
      return bounds == null || bounds[1] - bounds[0] > width;
    }
    for (long[] group : groups) {
      if (group[0] >= start && group[0] < start + length && group[2] - group[1] > width) {
        return true;
      }
    }
    return false;
  }

  int size() {
    return epochs.length;
  }

  /** Every row ingested before this has been emitted once `done` epochs are. */
  long watermark(int done) {
    return done == 0 ? windowStart : epochs[done - 1][1];
  }

  static String instant(long micros) {
    return Instant.EPOCH.plus(micros, ChronoUnit.MICROS).toString();
  }
}
