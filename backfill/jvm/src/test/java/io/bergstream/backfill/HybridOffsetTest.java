package io.bergstream.backfill;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.function.Function;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.junit.jupiter.api.Test;

/** The hybrid source's offsets: an archive phase, then Kafka's, in a canonical text tied to the plan. */
class HybridOffsetTest {
  /** Kafka's own offset, as Spark's Kafka source reads its text back (here: the text as it is). */
  private static final Function<String, Offset> KAFKA = text -> new Offset() {
    @Override
    public String json() {
      return text;
    }
  };
  private static final String ARCHIVE_2 =
      "{\"phase\":\"archive\",\"epoch\":2,\"epochs\":4,\"watermark\":\"2026-11-22T02:00:00Z\"}";
  private static final String KAFKA_PHASE = "{\"phase\":\"kafka\",\"epochs\":4,\"kafka\":{\"playback\":{\"0\":1300,\"1\":990}}}";

  @Test
  void eachPhaseWritesItsCanonicalText() {
    Plan plan = Plans.hybrid(4);
    assertEquals(ARCHIVE_2, HybridOffset.archive(2, plan).json());
    assertEquals(KAFKA_PHASE, HybridOffset.kafka(KAFKA.apply("{\"playback\":{\"0\":1300,\"1\":990}}"), plan).json());
  }

  @Test
  void textsWrittenByThisVersionAreReadBackToTheSameOffset() {
    Plan plan = Plans.hybrid(4);
    HybridOffset archive = HybridOffset.parse(ARCHIVE_2 + "\n", plan, KAFKA);
    assertTrue(archive.inArchive());
    assertEquals(2, archive.epoch());
    assertEquals(HybridOffset.ARCHIVE, archive.phase());
    HybridOffset kafka = HybridOffset.parse(KAFKA_PHASE, plan, KAFKA);
    assertFalse(kafka.inArchive());
    assertEquals(4, kafka.epoch());
    assertEquals(HybridOffset.KAFKA, kafka.phase());
    assertEquals(KAFKA_PHASE, kafka.json());
    for (int epoch = 0; epoch <= plan.size(); epoch++) {
      assertEquals(epoch, HybridOffset.parse(HybridOffset.archive(epoch, plan).json(), plan, KAFKA).epoch());
    }
  }

  @Test
  void everyArchiveOffsetComesBeforeEveryKafkaOffset() {
    Plan plan = Plans.hybrid(4);
    HybridOffset kafka = HybridOffset.kafka(KAFKA.apply("{\"playback\":{\"0\":1}}"), plan);
    for (int epoch = 0; epoch <= plan.size(); epoch++) {
      HybridOffset archive = HybridOffset.archive(epoch, plan);
      assertTrue(kafka.notBefore(archive));
      assertFalse(archive.notBefore(kafka));
      assertTrue(archive.notBefore(null));
      for (int other = 0; other <= plan.size(); other++) {
        assertEquals(epoch >= other, archive.notBefore(HybridOffset.archive(other, plan)), epoch + " " + other);
      }
    }
  }

  @Test
  void anOffsetOfAnotherPlanOrTopicIsRefused() {
    Plan plan = Plans.hybrid(4);
    for (String other : new String[] {
        HybridOffset.archive(2, Plans.hybrid(5)).json(),
        "{\"phase\":\"archive\",\"epoch\":5,\"epochs\":4,\"watermark\":\"2026-11-22T05:00:00Z\"}",
        "{\"phase\":\"archive\",\"epochs\":4,\"watermark\":\"2026-11-22T00:00:00Z\"}",
        "{\"phase\":\"kafka\",\"epochs\":5,\"kafka\":{\"playback\":{\"0\":1}}}",
        "{\"phase\":\"kafka\",\"epochs\":4,\"kafka\":{\"impression\":{\"0\":1}}}",
        "{\"phase\":\"kafka\",\"epochs\":4,\"kafka\":{\"playback\":{\"0\":1},\"impression\":{\"0\":1}}}",
        "{\"phase\":\"kafka\",\"epochs\":4,\"kafka\":{}}"}) {
      IllegalStateException refused =
          assertThrows(IllegalStateException.class, () -> HybridOffset.parse(other, plan, KAFKA), other);
      assertTrue(refused.getMessage().contains("then topic playback from the hand-over of snapshot 7"),
          refused.getMessage());
    }
  }

  @Test
  void aBackfillOffsetOrKafkasOwnIsNoHybridOffset() {
    Plan plan = Plans.hybrid(4);
    for (String other : new String[] {
        new EpochOffset(2, plan).json(), "{\"playback\":{\"0\":42}}", "[]", "3"}) {
      IllegalStateException refused =
          assertThrows(IllegalStateException.class, () -> HybridOffset.parse(other, plan, KAFKA), other);
      assertTrue(refused.getMessage().contains("is not a bergstream-hybrid offset"), refused.getMessage());
    }
    assertThrows(IllegalArgumentException.class, () -> HybridOffset.parse("{\"phase\":", plan, KAFKA));
  }
}
