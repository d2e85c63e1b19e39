package io.bergstream.backfill;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.JsonNode;
import java.lang.reflect.Constructor;
import java.lang.reflect.InvocationTargetException;

/** Plans as the Python planner writes them, read without a Spark session (Plan.read opens the file with one). */
final class Plans {
  static final long HOUR = 3_600_000_000L;
  static final long START = 1_795_305_600_000_000L;  // 2026-11-22T00:00:00Z

  private Plans() {}

  static Plan of(String json) {
    try {
      Constructor<Plan> made = Plan.class.getDeclaredConstructor(String.class, JsonNode.class);
      made.setAccessible(true);
      return made.newInstance("plan.json", new ObjectMapper().readTree(json));
    } catch (InvocationTargetException e) {
      if (e.getCause() instanceof RuntimeException refused) {
        throw refused;
      }
      throw new IllegalStateException(e);
    } catch (ReflectiveOperationException | java.io.IOException e) {
      throw new IllegalStateException(e);
    }
  }

  /** A plan of `count` epochs of an hour each from START, with `extra` members (",..." or ""). */
  static Plan hours(int count, String extra) {
    StringBuilder epochs = new StringBuilder();
    for (int i = 0; i < count; i++) {
      epochs.append(i == 0 ? "" : ",").append("[").append(START + i * HOUR).append(",").append(START + (i + 1) * HOUR)
          .append("]");
    }
    return of("{\"format\":1,\"table\":\"cat.archive.playback\",\"snapshot_id\":7,\"window\":[" + START + ","
        + (START + count * HOUR) + "],\"epochs\":[" + epochs + "]" + extra + "}");
  }

  static Plan hours(int count) {
    return hours(count, "");
  }

  /** The same with the hand-over to Kafka recorded by snapshot 7. */
  static Plan hybrid(int count) {
    return hours(count, ",\"source\":\"hybrid\",\"handover\":{\"topic\":\"playback\",\"cluster\":\"eu\","
        + "\"snapshot_id\":7,\"offsets\":{\"0\":1234,\"1\":987}}");
  }
}
