package io.bergstream.router;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.util.Map;
import org.junit.jupiter.api.Test;

/** Two routers' batches of one topic: the offsets both cover, by the ranges their commits record. */
class SecondWritersTest {
  static final SecondWriters.Keys KEYS =
      new SecondWriters.Keys("q", "b", "topic", "cluster", "start", "next");

  static Map<String, String> range(String start, String next) {
    return Map.of("start", start, "next", next);
  }

  @Test
  void theOffsetsBothRangesCoverAreNamedPartitionByPartition() {
    assertEquals("partition 0 offsets 150 to 199, partition 2 offsets 0 to 9",
        SecondWriters.overlap(range("{\"0\":100,\"1\":0,\"2\":0}", "{\"0\":200,\"1\":50,\"2\":10}"),
            range("{\"0\":150,\"2\":0}", "{\"0\":300,\"2\":10}"), KEYS));
  }

  @Test
  void rangesOneAfterTheOtherDoNotOverlap() {
    assertNull(SecondWriters.overlap(range("{\"0\":100}", "{\"0\":200}"), range("{\"0\":200}", "{\"0\":300}"),
        KEYS));
    // Another partition only.
    assertNull(SecondWriters.overlap(range("{\"0\":0}", "{\"0\":200}"), range("{\"1\":0}", "{\"1\":300}"), KEYS));
  }

  @Test
  void aStartByNameIsTheEarliestOffsetAndLatestIsTheRangesEnd() {
    assertEquals("partition 0 offsets 0 to 49",
        SecondWriters.overlap(range("earliest", "{\"0\":50}"), range("{\"0\":0}", "{\"0\":80}"), KEYS));
    assertNull(SecondWriters.overlap(range("latest", "{\"0\":50}"), range("{\"0\":0}", "{\"0\":80}"), KEYS));
  }
}
