package io.bergstream.router;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;
import org.apache.iceberg.spark.Spark3Util;
import org.apache.iceberg.util.SnapshotUtil;
import org.apache.spark.sql.SparkSession;

/**
 * What the router commits of a topic record in a table's current history, read by one walk of the table's
 * metadata, newest snapshot first, instead of a Spark job over its metadata tables for each question: the
 * topics the summaries name and, per topic, cluster and summary key asked for, the newest snapshot whose
 * summary has that key. A driver starting a thousand topics asks it several times a table.
 */
public final class RecordedHistory {
  private static final ObjectMapper JSON = new ObjectMapper();

  private RecordedHistory() {}

  /**
   * {@code {"topics": [...], "newest": [{"key", "topic", "cluster", "snapshot_id", "summary"}, ...]}} of
   * table {@code name} (catalog.namespace.table) as it is now: the topics among the summaries' {@code
   * topicKey}, and for each of {@code keys} the newest summary per topic and {@code clusterKey} holding it.
   */
  public static String of(SparkSession spark, String name, String topicKey, String clusterKey, String[] keys)
      throws Exception {
    Table table = Spark3Util.loadIcebergTable(spark, name);
    table.refresh();
    return JSON.writeValueAsString(walk(table, topicKey, clusterKey, keys));
  }

  static ObjectNode walk(Table table, String topicKey, String clusterKey, String[] keys) {
    Set<String> topics = new TreeSet<>();
    Set<String> found = new HashSet<>();
    ObjectNode answer = JSON.createObjectNode();
    ArrayNode newest = JSON.createArrayNode();
    for (Snapshot snapshot : SnapshotUtil.currentAncestors(table)) {
      Map<String, String> summary = snapshot.summary();
      String topic = summary.get(topicKey);
      if (topic == null) {
        continue;
      }
      topics.add(topic);
      String cluster = summary.get(clusterKey);
      for (String key : keys) {
        if (summary.get(key) == null || !found.add(key + '\u0000' + topic + '\u0000' + cluster)) {
          continue;
        }
        ObjectNode entry = newest.addObject();
        entry.put("key", key);
        entry.put("topic", topic);
        entry.put("cluster", cluster);
        entry.put("snapshot_id", snapshot.snapshotId());
        ObjectNode copied = entry.putObject("summary");
        summary.forEach(copied::put);
      }
    }
    ArrayNode named = answer.putArray("topics");
    topics.forEach(named::add);
    answer.set("newest", newest);
    return answer;
  }
}
