package io.bergstream.backfill;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * How far a backfill source is: the number of epochs emitted. The epoch count and the ingestion
 * watermark ride along for people reading the query's progress and checkpoint; only the epoch counts.
 */
final class EpochOffset extends Offset {
  final int epoch;
  private final int epochs;
  private final String watermark;

  EpochOffset(int epoch, Plan plan) {
    this.epoch = epoch;
    this.epochs = plan.size();
    this.watermark = Plan.instant(plan.watermark(epoch));
  }

  /** The epoch of an offset written against `plan`; refused when it was written against another plan. */
  static int epochOf(String json, Plan plan) {
    int epoch = epochOf(json);
    if (epoch < 0 || epoch > plan.size() || !new EpochOffset(epoch, plan).json().equals(json.strip())) {
      throw new IllegalStateException(
          "checkpointed offset " + json + " was not made by plan " + plan.path + " (" + plan.size()
              + " epochs from " + Plan.instant(plan.windowStart) + "): the checkpoint belongs to another"
              + " backfill; give this one a checkpoint of its own");
    }
    return epoch;
  }

  static int epochOf(String json) {
    try {
      JsonNode node = new ObjectMapper().readTree(json);
      if (!node.path("epoch").canConvertToInt()) {
        throw new IllegalArgumentException("not a bergstream-backfill offset: " + json);
      }
      return node.get("epoch").asInt();
    } catch (IOException e) {
      throw new IllegalArgumentException("not a bergstream-backfill offset: " + json, e);
    }
  }

  @Override
  public String json() {
    return "{\"epoch\":" + epoch + ",\"epochs\":" + epochs + ",\"watermark\":\"" + watermark + "\"}";
  }
}
