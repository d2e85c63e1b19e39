package io.bergstream.backfill;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.Iterator;
import java.util.function.Function;
import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * How far a {@code bergstream-hybrid} source is, in one of its two phases:
 *
 * <pre>
 * {"phase":"archive","epoch":3,"epochs":96,"watermark":"2026-01-05T03:00:00Z"}  the epochs emitted
 * {"phase":"kafka","epochs":96,"kafka":{"playback":{"0":1234,"1":987}}}          Kafka's own offset
 * </pre>
 *
 * <p>Spark tells new data by comparing offsets' JSON, so the JSON is canonical: fixed key order, and
 * Kafka's part as Kafka writes it (partitions ascending), rebuilt from Kafka's own offset when read back.
 * The epoch count (and in the archive phase the watermark) ties an offset to its plan: an offset of
 * another plan is refused, as a checkpoint of another backfill is.
 */
final class HybridOffset extends Offset {
  static final String ARCHIVE = "archive";
  static final String KAFKA = "kafka";
  private static final ObjectMapper JSON = new ObjectMapper();

  // The epochs emitted, in the archive phase; null once Kafka has taken over.
  final EpochOffset archive;
  // Kafka's own offset (Spark's KafkaSourceOffset), in the Kafka phase; null before.
  final Offset kafka;
  private final int epochs;

  private HybridOffset(EpochOffset archive, Offset kafka, int epochs) {
    this.archive = archive;
    this.kafka = kafka;
    this.epochs = epochs;
  }

  static HybridOffset archive(int epoch, Plan plan) {
    return new HybridOffset(new EpochOffset(epoch, plan), null, plan.size());
  }

  static HybridOffset kafka(Offset kafka, Plan plan) {
    return new HybridOffset(null, kafka, plan.size());
  }

  boolean inArchive() {
    return archive != null;
  }

  /** The epochs emitted: all of them once Kafka has taken over. */
  int epoch() {
    return archive != null ? archive.epoch : epochs;
  }

  String phase() {
    return inArchive() ? ARCHIVE : KAFKA;
  }

  /** Whether this offset is at or past `other`: every archive offset comes before every Kafka offset. */
  boolean notBefore(HybridOffset other) {
    return other == null || !inArchive() || (other.inArchive() && epoch() >= other.epoch());
  }

  /**
   * The offset `json` written against `plan`; `kafka` reads Kafka's part back into Kafka's own offset.
   * Refused when it was written by another source or against another plan.
   */
  static HybridOffset parse(String json, Plan plan, Function<String, Offset> kafka) {
    JsonNode node;
    try {
      node = JSON.readTree(json);
    } catch (IOException e) {
      throw new IllegalArgumentException("not a bergstream-hybrid offset: " + json, e);
    }
    String phase = node == null ? "" : node.path("phase").asText("");
    if (phase.equals(ARCHIVE)) {
      int epoch = node.path("epoch").canConvertToInt() ? node.get("epoch").asInt() : -1;
      if (epoch < 0 || epoch > plan.size() || !archive(epoch, plan).json().equals(json.strip())) {
        throw notOfPlan(json, plan);
      }
      return archive(epoch, plan);
    }
    if (phase.equals(KAFKA)) {
      JsonNode offsets = node.path("kafka");
      if (node.path("epochs").asInt(-1) != plan.size() || !offsets.isObject() || !onlyTopic(offsets, plan)) {
        throw notOfPlan(json, plan);
      }
      return kafka(kafka.apply(offsets.toString()), plan);
    }
    throw new IllegalStateException(
        "checkpointed offset " + json + " is not a bergstream-hybrid offset: the checkpoint belongs to"
            + " another query; give this one a checkpoint of its own");
  }

  private static boolean onlyTopic(JsonNode offsets, Plan plan) {
    Iterator<String> topics = offsets.fieldNames();
    return topics.hasNext() && topics.next().equals(plan.handover.topic) && !topics.hasNext();
  }

  private static IllegalStateException notOfPlan(String json, Plan plan) {
    return new IllegalStateException(
        "checkpointed offset " + json + " was not made by plan " + plan.path + " (" + plan.size()
            + " epochs from " + Plan.instant(plan.windowStart) + ", then topic " + plan.handover.topic
            + " from the hand-over of snapshot " + plan.handover.snapshotId + "): the checkpoint belongs to"
            + " another run; give this one a checkpoint of its own");
  }

  @Override
  public String json() {
    if (archive != null) {
      String epoch = archive.json();  // {"epoch":..,"epochs":..,"watermark":".."}
      return "{\"phase\":\"" + ARCHIVE + "\"," + epoch.substring(1);
    }
    return "{\"phase\":\"" + KAFKA + "\",\"epochs\":" + epochs + ",\"kafka\":" + kafka.json() + "}";
  }
}
