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
}
