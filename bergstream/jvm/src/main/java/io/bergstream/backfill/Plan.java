package io.bergstream.backfill;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * One source's part of a backfill, as the Python planner wrote it: the table, its snapshot, the regions
 * and the epochs ([lo, hi) ingestion times in microseconds, ascending, inside the window). It is read
 * once on the driver and never changes, so that offsets can be plain epoch indexes into it.
 */
final class Plan {
  static final int FORMAT = 1;

  final String path;
  final String source;
  final String table;
  final Long snapshotId;  // null: pin the table's current snapshot when the stream is created
  final List<String> regions;  // null: every region
  final long windowStart;
  final long windowEnd;
  private final long[] lows;
  private final long[] highs;

  private Plan(String path, JsonNode node) {
    this.path = path;
    int format = node.path("format").asInt(-1);
    if (format != FORMAT) {
      throw invalid("format " + node.path("format") + ", but this source reads format " + FORMAT);
    }
    this.table = text(node, "table");
    this.source = node.hasNonNull("source") ? node.get("source").asText() : table;
    JsonNode snapshot = node.get("snapshot_id");
    if (snapshot == null || snapshot.isNull()) {
      this.snapshotId = null;
    } else if (snapshot.isIntegralNumber() && snapshot.canConvertToLong()) {
      this.snapshotId = snapshot.asLong();
    } else {
      throw invalid("'snapshot_id' must be a snapshot id or null, not " + snapshot);
    }
    this.regions = regions(node.get("regions"));
    long[] window = range(node.get("window"), "'window'");
    this.windowStart = window[0];
    this.windowEnd = window[1];
    JsonNode epochs = node.get("epochs");
    if (epochs == null || !epochs.isArray()) {
      throw invalid("no 'epochs' list");
    }
    this.lows = new long[epochs.size()];
    this.highs = new long[epochs.size()];
    long previous = windowStart;
    for (int i = 0; i < epochs.size(); i++) {
      long[] epoch = range(epochs.get(i), "epoch " + i);
      if (epoch[0] < previous || epoch[1] > windowEnd) {
        throw invalid("epoch " + i + " " + span(epoch[0], epoch[1])
            + " overlaps the one before it or leaves the window " + span(windowStart, windowEnd));
      }
      lows[i] = epoch[0];
      highs[i] = epoch[1];
      previous = epoch[1];
    }
  }

  /** Reads and checks the plan file; every refusal names the file. */
  static Plan read(String path) {
    if (path == null || path.isBlank()) {
      throw new IllegalArgumentException(
          "bergstream-backfill needs option 'plan': the path of the plan file the backfill planner wrote");
    }
    JsonNode node;
    try {
      node = new ObjectMapper().readTree(Files.readAllBytes(Path.of(path)));
    } catch (IOException | RuntimeException e) {
      throw new IllegalArgumentException(
          "bergstream-backfill cannot read plan file " + path + ": " + e, e);
    }
    if (node == null || !node.isObject()) {
      throw new IllegalArgumentException("bergstream-backfill plan file " + path + " is not a JSON object");
    }
    return new Plan(path, node);
  }

  int size() {
    return lows.length;
  }

  long low(int epoch) {
    return lows[epoch];
  }

  long high(int epoch) {
    return highs[epoch];
  }

  /** Every row ingested before this has been emitted once `done` epochs are. */
  long watermark(int done) {
    return done == 0 ? windowStart : highs[done - 1];
  }

  static String instant(long micros) {
    return Instant.EPOCH.plus(micros, ChronoUnit.MICROS).toString();
  }

  static String span(long lo, long hi) {
    return "[" + instant(lo) + ", " + instant(hi) + ")";
  }

  private String text(JsonNode node, String key) {
    JsonNode value = node.get(key);
    if (value == null || !value.isTextual() || value.asText().isBlank()) {
      throw invalid("no '" + key + "'");
    }
    return value.asText();
  }

  private List<String> regions(JsonNode node) {
    if (node == null || node.isNull()) {
      return null;
    }
    if (!node.isArray() || node.isEmpty()) {
      throw invalid("'regions' must be a non-empty list of region names or null, not " + node);
    }
    List<String> names = new ArrayList<>();
    for (JsonNode region : node) {
      if (!region.isTextual()) {
        throw invalid("'regions' must hold region names, not " + region);
      }
      names.add(region.asText());
    }
    return Collections.unmodifiableList(names);
  }

  private long[] range(JsonNode node, String what) {
    if (node == null || !node.isArray() || node.size() != 2
        || !node.get(0).isIntegralNumber() || !node.get(1).isIntegralNumber()) {
      throw invalid(what + " must be [lo, hi] in microseconds since the epoch, not " + node);
    }
    long lo = node.get(0).asLong();
    long hi = node.get(1).asLong();
    if (lo >= hi) {
      throw invalid(what + " " + node + " is empty");
    }
    return new long[] {lo, hi};
  }

  private IllegalArgumentException invalid(String why) {
    return new IllegalArgumentException("bergstream-backfill plan file " + path + ": " + why);
  }
}
