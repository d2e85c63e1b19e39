package io.bergstream.router;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Iterator;
import java.util.Map;
import java.util.TreeMap;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;

/**
 * Another router's commit of the same topic and cluster covering offsets a batch covers: the topic written
 * into the table twice. Looked for among the snapshots since the query's own last commit, on the table the
 * writer has loaded already (bergstream.router.write's `overlapping` does the same for a table written
 * alone).
 */
final class SecondWriters {
  /** How far back from the newest snapshot the query's own last commit is looked for. */
  static final int NEWEST_SNAPSHOTS = 20;
  private static final ObjectMapper JSON = new ObjectMapper();

  private SecondWriters() {}

  /**
   * The snapshot properties' names, as bergstream.router.write and bergstream.schemas.batch_range give them:
   * the query's id, the batch's id, the topic, the cluster, the batch's start and its next offsets.
   */
  record Keys(String queryId, String batchId, String topic, String cluster, String start, String next) {}

  /**
   * "query Q committed partition P offsets A to B in snapshot S" for the first other router's commit since
   * the query's last one that covers offsets {@code ours} (the batch's properties) covers; null when none.
   * {@code committed}: the batch is committed, and its own commit is passed over.
   */
  static String overlapping(Table table, Map<String, String> ours, Keys keys, boolean committed) {
    Snapshot snapshot = table.currentSnapshot();
    for (int i = 0; i < NEWEST_SNAPSHOTS && snapshot != null; i++) {
      Map<String, String> summary = snapshot.summary();
      String query = summary.get(keys.queryId());
      if (ours.get(keys.queryId()).equals(query)) {
        if (!committed || !ours.get(keys.batchId()).equals(summary.get(keys.batchId()))) {
          return null;
        }
      } else if (query != null
          && ours.get(keys.topic()).equals(summary.get(keys.topic()))
          && ours.get(keys.cluster()).equals(summary.get(keys.cluster()))
          && summary.get(keys.next()) != null) {
        String shared = overlap(ours, summary, keys);
        if (shared != null) {
          return "query " + query + " committed " + shared + " in snapshot " + snapshot.snapshotId();
        }
      }
      Long parent = snapshot.parentId();
      snapshot = parent == null ? null : table.snapshot(parent);
    }
    return null;
  }

  /** The offsets both ranges cover, as text; null when none. A start by name is `earliest` (0). */
  static String overlap(Map<String, String> ours, Map<String, String> theirs, Keys keys) {
    Map<Integer, Long> ourEnd = offsets(ours.get(keys.next()));
    Map<Integer, Long> theirEnd = offsets(theirs.get(keys.next()));
    Map<Integer, Long> ourStart = starts(ours.get(keys.start()), ourEnd);
    Map<Integer, Long> theirStart = starts(theirs.get(keys.start()), theirEnd);
    StringBuilder shared = new StringBuilder();
    for (Map.Entry<Integer, Long> end : new TreeMap<>(ourEnd).entrySet()) {
      Long other = theirEnd.get(end.getKey());
      if (other == null) {
        continue;
      }
      long first = Math.max(ourStart.getOrDefault(end.getKey(), 0L), theirStart.getOrDefault(end.getKey(), 0L));
      long last = Math.min(end.getValue(), other);
      if (first < last) {
        shared.append(shared.length() == 0 ? "" : ", ")
            .append("partition ").append(end.getKey()).append(" offsets ").append(first).append(" to ")
            .append(last - 1);
      }
    }
    return shared.length() == 0 ? null : shared.toString();
  }

  private static Map<Integer, Long> starts(String start, Map<Integer, Long> end) {
    if (start == null || !start.strip().startsWith("{")) {
      Map<Integer, Long> named = new TreeMap<>();
      // `latest`'s offsets are not known here: taken as the range's end; any other name as 0.
      end.forEach((partition, offset) -> named.put(partition, "latest".equals(start) ? offset : 0L));
      return named;
    }
    return offsets(start);
  }

  static Map<Integer, Long> offsets(String text) {
    try {
      Map<Integer, Long> offsets = new TreeMap<>();
      JsonNode node = JSON.readTree(text);
      for (Iterator<Map.Entry<String, JsonNode>> fields = node.fields(); fields.hasNext(); ) {
        Map.Entry<String, JsonNode> field = fields.next();
        offsets.put(Integer.parseInt(field.getKey()), field.getValue().asLong());
      }
      return offsets;
    } catch (IOException error) {
      throw new UncheckedIOException("not a set of offsets: " + text, error);
    }
  }
}
