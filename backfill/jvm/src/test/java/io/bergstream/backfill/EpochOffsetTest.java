package io.bergstream.backfill;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/** A backfill's offsets, as its checkpoint keeps them: the epoch read back, anything else refused. */
class EpochOffsetTest {
  @Test
  void theEpochIsReadBackFromTheCheckpointedText() {
    assertEquals(3, EpochOffset.epochOf("{\"epoch\":3,\"epochs\":12,\"watermark\":\"2026-11-27T10:00:00Z\"}"));
    assertEquals(0, EpochOffset.epochOf(" {\"epoch\":0} "));
  }

  @Test
  void anOffsetOfAnotherSourceIsRefusedNamingIt() {
    String kafka = "{\"playback\":{\"0\":42}}";
    IllegalArgumentException refused =
        assertThrows(IllegalArgumentException.class, () -> EpochOffset.epochOf(kafka));
    assertEquals("not a bergstream-backfill offset: " + kafka, refused.getMessage());
    IllegalArgumentException broken =
        assertThrows(IllegalArgumentException.class, () -> EpochOffset.epochOf("{\"epoch\":"));
    assertTrue(broken.getMessage().startsWith("not a bergstream-backfill offset"));
  }

  @Test
  void theTextIsTheEpochTheEpochCountAndTheWatermarkInThatOrder() {
    Plan plan = Plans.hours(4);
    assertEquals("{\"epoch\":0,\"epochs\":4,\"watermark\":\"2026-11-22T00:00:00Z\"}", new EpochOffset(0, plan).json());
    assertEquals("{\"epoch\":3,\"epochs\":4,\"watermark\":\"2026-11-22T03:00:00Z\"}", new EpochOffset(3, plan).json());
    assertEquals("{\"epoch\":4,\"epochs\":4,\"watermark\":\"2026-11-22T04:00:00Z\"}", new EpochOffset(4, plan).json());
  }

  @Test
  void anOffsetWrittenByThisVersionIsReadBackAgainstItsPlan() {
    Plan plan = Plans.hours(4);
    // As a checkpoint of this version holds it: a change of the form must still read these.
    assertEquals(2, EpochOffset.epochOf("{\"epoch\":2,\"epochs\":4,\"watermark\":\"2026-11-22T02:00:00Z\"}\n", plan));
    for (int epoch = 0; epoch <= plan.size(); epoch++) {
      assertEquals(epoch, EpochOffset.epochOf(new EpochOffset(epoch, plan).json(), plan));
    }
  }

  @Test
  void anOffsetOfAnotherPlanIsRefusedNamingThePlan() {
    Plan plan = Plans.hours(4);
    for (String other : new String[] {
        new EpochOffset(2, Plans.hours(5)).json(),
        "{\"epoch\":2,\"epochs\":4,\"watermark\":\"2026-11-22T01:00:00Z\"}",
        "{\"epoch\":5,\"epochs\":4,\"watermark\":\"2026-11-22T05:00:00Z\"}",
        "{\"epoch\":-1,\"epochs\":4,\"watermark\":\"2026-11-22T00:00:00Z\"}",
        "{\"epoch\":2}"}) {
      IllegalStateException refused = assertThrows(IllegalStateException.class, () -> EpochOffset.epochOf(other, plan));
      assertTrue(refused.getMessage().contains("was not made by plan plan.json (4 epochs from 2026-11-22T00:00:00Z)"),
          refused.getMessage());
    }
  }
}
