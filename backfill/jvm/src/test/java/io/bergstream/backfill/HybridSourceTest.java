package io.bergstream.backfill;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.junit.jupiter.api.Test;

/** The options Spark's Kafka source is given: the user's, with the hand-over's topic and start. */
class HybridSourceTest {
  @Test
  void sparksKafkaSourceReadsTheHandoversTopicFromItsOffsets() {
    CaseInsensitiveStringMap kafka = HybridSource.kafkaOptions(Map.of(
        "plan", "plan.json",
        "path", "plan.json",
        "Subscribe", " playback ",
        "kafka.bootstrap.servers", "broker:9092",
        "failOnDataLoss", "false",
        "maxOffsetsPerTrigger", "1000"), Plans.hybrid(4));
    assertEquals("playback", kafka.get("subscribe"));
    assertEquals("true", kafka.get("includeHeaders"));
    assertEquals("{\"playback\":{\"0\":1234,\"1\":987}}", kafka.get("startingOffsets"));
    assertEquals("broker:9092", kafka.get("kafka.bootstrap.servers"));
    assertEquals("false", kafka.get("failOnDataLoss"));
    assertEquals("1000", kafka.get("maxOffsetsPerTrigger"));
    assertFalse(kafka.containsKey("plan"));
    assertFalse(kafka.containsKey("path"));
  }

  @Test
  void optionsThatWouldReadFromElsewhereOrOtherwiseAreRefused() {
    for (Map<String, String> options : List.of(
        Map.of("startingOffsets", "earliest"),
        Map.of("STARTINGOFFSETS", "{\"playback\":{\"0\":0}}"),
        Map.of("startingTimestamp", "0"),
        Map.of("assign", "{\"playback\":[0,1]}"),
        Map.of("subscribePattern", "play.*"),
        Map.of("subscribe", "impression"),
        Map.of("includeHeaders", "false"))) {
      IllegalArgumentException refused = assertThrows(
          IllegalArgumentException.class, () -> HybridSource.kafkaOptions(options, Plans.hybrid(4)), options.toString());
      assertTrue(refused.getMessage().contains("reads topic playback from the hand-over offsets"), refused.getMessage());
    }
  }
}
