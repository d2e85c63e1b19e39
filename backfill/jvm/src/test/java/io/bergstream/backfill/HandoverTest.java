package io.bergstream.backfill;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * Where the archive ends and its topic takes over, as a plan's "handover" records it: what is read, what
 * is refused before Kafka is asked. Asking Kafka itself (retention, a recreated topic) needs a broker.
 */
class HandoverTest {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String PLAYBACK =
      "{\"topic\":\"playback\",\"cluster\":\"eu\",\"snapshot_id\":7,\"offsets\":{\"1\":987,\"0\":1234}";

  private static JsonNode json(String text) {
    try {
      return JSON.readTree(text);
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }

  private static Handover of(String text) {
    return Handover.of(json(text));
  }

  @Test
  void aPlansHandoverIsReadWithItsOffsetsAscendingByPartition() {
    Handover handover = of(PLAYBACK + "}");
    assertEquals("playback", handover.topic);
    assertEquals("eu", handover.cluster);
    assertEquals(7, handover.snapshotId);
    assertEquals(List.of(0, 1), List.copyOf(handover.offsets.keySet()));
    assertEquals(Map.of(0, 1234L, 1, 987L), handover.offsets);
    assertNull(handover.isolationLevel);
    assertNull(handover.topicId);
    assertEquals("{\"playback\":{\"0\":1234,\"1\":987}}", handover.startingOffsets());
  }

  @Test
  void theIsolationLevelAndTopicIdAreKeptWhenRecorded() {
    Handover handover =
        of(PLAYBACK + ",\"isolation_level\":\"read_committed\",\"topic_id\":\"Xq7r0sVfT1aXtYbR2c9m4w\"}");
    assertEquals("read_committed", handover.isolationLevel);
    assertEquals("Xq7r0sVfT1aXtYbR2c9m4w", handover.topicId);
    assertEquals("READ_UNCOMMITTED", of(PLAYBACK + ",\"isolation_level\":\"READ_UNCOMMITTED\"}").isolationLevel);
    assertNull(of(PLAYBACK + ",\"isolation_level\":\"\",\"topic_id\":\"\"}").isolationLevel);
  }

  @Test
  void anIsolationLevelKafkaDoesNotHaveIsRefused() {
    for (String level : List.of("\"snapshot\"", "\"committed\"", "true")) {
      IllegalArgumentException refused = assertThrows(
          IllegalArgumentException.class, () -> of(PLAYBACK + ",\"isolation_level\":" + level + "}"), level);
      assertTrue(refused.getMessage().contains("not a Kafka level"), refused.getMessage());
    }
  }

  @Test
  void aHandoverWithoutTopicClusterOrSnapshotIsRefused() {
    String offsets = "\"offsets\":{\"0\":1}";
    for (String text : List.of(
        "[]",
        "\"playback\"",
        "{\"cluster\":\"eu\",\"snapshot_id\":7," + offsets + "}",
        "{\"topic\":\"\",\"cluster\":\"eu\",\"snapshot_id\":7," + offsets + "}",
        "{\"topic\":\"playback\",\"snapshot_id\":7," + offsets + "}",
        "{\"topic\":\"playback\",\"cluster\":\"eu\"," + offsets + "}",
        "{\"topic\":\"playback\",\"cluster\":\"eu\",\"snapshot_id\":\"latest\"," + offsets + "}",
        "{\"topic\":\"playback\",\"cluster\":\"eu\",\"snapshot_id\":7.9," + offsets + "}")) {
      assertThrows(IllegalArgumentException.class, () -> of(text), text);
    }
  }

  @Test
  void offsetsThatAreNotAPartitionAndItsNextOffsetAreRefused() {
    for (String offsets : List.of(
        "{}", "[1234]", "1234", "{\"-1\":5}", "{\"zero\":5}", "{\"0\":-1}", "{\"0\":\"1234\"}", "{\"0\":null}",
        // A partition written another way than Kafka's, an offset that is no whole number.
        "{\"01\":5}", "{\"+1\":5}", "{\"1\":5,\"01\":9}", "{\"0\":1174.5}", "{\"0\":1e3}")) {
      String text = "{\"topic\":\"playback\",\"cluster\":\"eu\",\"snapshot_id\":7,\"offsets\":" + offsets + "}";
      IllegalArgumentException refused = assertThrows(IllegalArgumentException.class, () -> of(text), offsets);
      assertTrue(refused.getMessage().contains("the hand-over of topic playback"), refused.getMessage());
    }
    String none = "{\"topic\":\"playback\",\"cluster\":\"eu\",\"snapshot_id\":7}";
    assertThrows(IllegalArgumentException.class, () -> of(none));
    assertEquals(Map.of(0, 0L), of("{\"topic\":\"t\",\"cluster\":\"eu\",\"snapshot_id\":7,\"offsets\":{\"0\":0}}").offsets);
  }

  @Test
  void aPlannedHandoverIsParsedBeforeKafkaIsAsked() {
    Map<String, String> noBroker = Map.of("kafka.isolation.level", "read_committed");
    assertThrows(IllegalArgumentException.class, () -> Handover.checkPlanned(noBroker, "{\"topic\":", "at start"));
    assertThrows(IllegalArgumentException.class, () -> Handover.checkPlanned(noBroker, null, "at start"));
    IllegalArgumentException levelRefused = assertThrows(IllegalArgumentException.class,
        () -> Handover.checkPlanned(noBroker, PLAYBACK + ",\"isolation_level\":\"snapshot\"}", "at start"));
    assertTrue(levelRefused.getMessage().contains("not a Kafka level"), levelRefused.getMessage());
    IllegalArgumentException noBootstrap = assertThrows(IllegalArgumentException.class,
        () -> Handover.checkPlanned(noBroker, PLAYBACK + "}", "at the switch"));
    assertEquals("playback: at the switch: the hand-over offsets cannot be checked without option"
        + " kafka.bootstrap.servers", noBootstrap.getMessage());
  }

  @Test
  void offsetsToCheckAreTakenPlainOrInSparksKafkaForm() {
    Map<String, String> noBroker = Map.of("subscribe", "playback", "bootstrap.servers", "not-a-kafka-option:9092");
    for (String offsets : List.of("{\"0\":1234,\"1\":987}", "{\"playback\":{\"0\":1234,\"1\":987}}")) {
      IllegalArgumentException refused = assertThrows(
          IllegalArgumentException.class, () -> Handover.check(noBroker, "playback", offsets, "at start"), offsets);
      assertTrue(refused.getMessage().endsWith("without option kafka.bootstrap.servers"), refused.getMessage());
    }
    for (String offsets : List.of(
        "{\"impression\":{\"0\":1234}}", "{\"playback\":{\"0\":1234},\"impression\":{\"0\":1}}", "{\"0\":", "")) {
      IllegalArgumentException refused = assertThrows(
          IllegalArgumentException.class, () -> Handover.check(noBroker, "playback", offsets, "at start"), offsets);
      assertTrue(!refused.getMessage().contains("bootstrap.servers"), refused.getMessage());
    }
    for (String topic : new String[] {null, ""}) {
      assertThrows(IllegalArgumentException.class, () -> Handover.check(noBroker, topic, "{\"0\":1}", "at start"));
    }
  }
}
