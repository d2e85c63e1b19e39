package io.bergstream.backfill;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * How far a backfill source is: the number of epochs emitted. The epoch count and the watermark (the
 * upper bound of the last emitted epoch) ride along for people who read progress and checkpoints; they
 * are functions of the epoch and the plan, so the same epoch always serializes the same way.
 */
final class EpochOffset extends Offset {
  final int epoch;
  private final String json;

  private EpochOffset(int epoch, String json) {
    this.epoch = epoch;
    this.json = json;
  }

  static EpochOffset of(int epoch, Plan plan) {
    return new EpochOffset(epoch, "{\"epoch\":" + epoch + ",\"epochs\":" + plan.size()
        + ",\"watermark\":\"" + Plan.instant(plan.watermark(epoch)) + "\"}");
  }

  /** Spark hands back its own offsets, or ones read from the checkpoint, as any Offset. */
  static EpochOffset of(Offset offset, Plan plan) {
    return offset instanceof EpochOffset epochOffset ? epochOffset : parse(offset.json(), plan);
  }

  /**
   * An offset from a checkpoint. Only `epoch` counts; `epochs` and `watermark`, when present, must agree
   * with the plan, or the checkpoint was written by a backfill of other epochs and resuming it by epoch
   * index would skip or repeat rows. The text is kept as read: Spark compares offsets by their JSON.
   */
  static EpochOffset parse(String json, Plan plan) {
    JsonNode node;
    try {
      node = new ObjectMapper().readTree(json);
    } catch (IOException e) {
      throw notOurs(json, plan, e);
    }
    if (node == null || !node.path("epoch").canConvertToInt() || !node.path("epoch").isIntegralNumber()) {
      throw notOurs(json, plan, null);
    }
    int epoch = node.get("epoch").asInt();
    if (epoch < 0 || epoch > plan.size()) {
      throw otherPlan(json, plan, "epoch " + epoch + " is not within its " + plan.size() + " epochs");
    }
    if (node.has("epochs") && node.get("epochs").asLong() != plan.size()) {
      throw otherPlan(json, plan, "it has " + plan.size() + " epochs");
    }
    String watermark = Plan.instant(plan.watermark(epoch));
    if (node.has("watermark") && !node.get("watermark").asText().equals(watermark)) {
      throw otherPlan(json, plan, "epoch " + epoch + " ends at " + watermark);
    }
    return new EpochOffset(epoch, json);
  }

  @Override
  public String json() {
    return json;
  }

  private static IllegalArgumentException notOurs(String json, Plan plan, Throwable cause) {
    return new IllegalArgumentException(
        "bergstream-backfill (plan file " + plan.path + "): " + json + " is not an offset of this source",
        cause);
  }

  private static IllegalStateException otherPlan(String json, Plan plan, String why) {
    return new IllegalStateException("bergstream-backfill: the checkpoint's offset " + json
        + " was not written for plan file " + plan.path + " (" + why + "); a checkpoint resumes only"
        + " the backfill that wrote it");
  }
}
