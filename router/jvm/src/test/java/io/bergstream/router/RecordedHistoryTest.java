package io.bergstream.router;

import static org.junit.jupiter.api.Assertions.assertEquals;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.AppendFiles;
import org.apache.iceberg.DataFiles;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.Schema;
import org.apache.iceberg.Table;
import org.apache.iceberg.hadoop.HadoopTables;
import org.apache.iceberg.types.Types;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** One walk of a table's current history answers what the router asks of its commits' summaries. */
class RecordedHistoryTest {
  static final String[] KEYS = {"next", "topic-id"};
  @TempDir Path warehouse;
  int files;

  Table table() {
    Schema schema = new Schema(Types.NestedField.optional(1, "title", Types.StringType.get()));
    return new HadoopTables(new Configuration()).create(schema, PartitionSpec.unpartitioned(),
        warehouse.resolve("t").toUri().toString());
  }

  long append(Table table, Map<String, String> summary) {
    AppendFiles append = table.newFastAppend().appendFile(DataFiles.builder(PartitionSpec.unpartitioned())
        .withPath(warehouse + "/t/data/" + files++ + ".parquet").withFileSizeInBytes(10).withRecordCount(1)
        .build());
    summary.forEach(append::set);
    append.commit();
    return table.currentSnapshot().snapshotId();
  }

  /** The newest entries of the answer as "key topic cluster snapshot next", newest first. */
  static List<String> newest(ObjectNode answer, Map<Long, String> names) {
    List<String> found = new ArrayList<>();
    for (JsonNode entry : answer.get("newest")) {
      found.add(entry.get("key").asText() + " " + entry.get("topic").asText() + " "
          + entry.get("cluster").asText() + " " + names.get(entry.get("snapshot_id").asLong()) + " "
          + entry.get("summary").path("next").asText("-"));
    }
    return found;
  }

  @Test
  void theNewestOfEachKeyTopicAndClusterAmongTheCurrentAncestorsAndEveryTopicTheyName() {
    Table table = table();
    Map<Long, String> names = new java.util.HashMap<>();
    names.put(append(table, Map.of("topic", "plays", "cluster", "eu", "next", "1", "topic-id", "A")), "s1");
    names.put(append(table, Map.of("topic", "plays", "cluster", "us", "next", "2")), "s2");
    names.put(append(table, Map.of()), "maintenance");
    names.put(append(table, Map.of("topic", "plays", "cluster", "eu", "next", "3")), "s3");
    long kept = table.currentSnapshot().snapshotId();
    // Rolled back: neither its position nor its topic is the table's any more.
    names.put(append(table, Map.of("topic", "clicks", "cluster", "eu", "next", "9", "topic-id", "B")), "gone");
    table.manageSnapshots().rollbackTo(kept).commit();
    names.put(append(table, Map.of("topic", "plays", "cluster", "eu", "topic-id", "C")), "s4");

    ObjectNode answer = RecordedHistory.walk(table, "topic", "cluster", KEYS);

    assertEquals("[\"plays\"]", answer.get("topics").toString());
    assertEquals(List.of("topic-id plays eu s4 -", "next plays eu s3 3", "next plays us s2 2"),
        newest(answer, names));
  }

  @Test
  void aTableWithoutTheRoutersCommitsRecordsNothing() {
    Table table = table();
    assertEquals("{\"topics\":[],\"newest\":[]}", RecordedHistory.walk(table, "topic", "cluster", KEYS)
        .toString());
    append(table, Map.of("spark.app.id", "x"));
    assertEquals("{\"topics\":[],\"newest\":[]}", RecordedHistory.walk(table, "topic", "cluster", KEYS)
        .toString());
  }
}
