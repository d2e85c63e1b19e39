package io.bergstream.backfill;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.Serializable;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.SortedMap;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;

/**
 * Where an archive ends and its topic takes over: the Kafka positions the router recorded in the
 * archive snapshot a plan reads ({@code bergstream.kafka.next-offsets}), the next offset of every
 * partition after the archived rows, and the topic and cluster they were read from.
 *
 * <p>{@link #check} refuses a hand-over that Kafka no longer holds: a partition whose hand-over offset is
 * below the earliest offset Kafka still has (records deleted by retention), above its next offset (the
 * topic was recreated), or a partition the topic no longer has. The archive's records end where Kafka's
 * must begin, so reading on from anywhere else would lose or repeat records.
 *
 * <p>The check asks Kafka with an admin client made from the {@code kafka.*} options, the prefix
 * stripped, as Spark's Kafka source makes its own. A delegation token that Spark obtains for its Kafka
 * source is not seen here: a cluster reached by delegation tokens needs its login in the
 * {@code kafka.*} options as well.
 */
public final class Handover implements Serializable {
  private static final long serialVersionUID = 1L;
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String KAFKA_PREFIX = "kafka.";

  final String topic;
  final String cluster;
  final long snapshotId;
  // Partition -> next offset, ascending by partition.
  final SortedMap<Integer, Long> offsets;
  // The isolation level the archive was read with, which Kafka is asked at; null in a plan written before
  // the plan carried it (the Kafka options' level is then asked at).
  final String isolationLevel;
  // Kafka's id of the topic the router read (its own tools' text); null where the router commit records
  // none. A topic of the same name with another id was deleted and created again: its offsets started over.
  final String topicId;

  private Handover(
      String topic,
      String cluster,
      long snapshotId,
      SortedMap<Integer, Long> offsets,
      String isolationLevel,
      String topicId) {
    this.topic = topic;
    this.cluster = cluster;
    this.snapshotId = snapshotId;
    this.offsets = Collections.unmodifiableSortedMap(offsets);
    this.isolationLevel = isolationLevel;
    this.topicId = topicId;
  }

  /**
   * The plan's {@code "handover": {"topic", "cluster", "snapshot_id", "offsets": {"0": 1174, ...},
   * "isolation_level": "read_committed", "topic_id": "..."}}, the level and the id optional.
   */
  static Handover of(JsonNode node) {
    if (!node.isObject()) {
      throw new IllegalArgumentException("'handover' is not an object");
    }
    String topic = node.path("topic").asText("");
    String cluster = node.path("cluster").asText("");
    if (topic.isEmpty() || cluster.isEmpty()) {
      throw new IllegalArgumentException("'handover' needs a 'topic' and a 'cluster'");
    }
    if (!node.path("snapshot_id").isIntegralNumber() || !node.path("snapshot_id").canConvertToLong()) {
      throw new IllegalArgumentException("'handover' needs the 'snapshot_id' that recorded its offsets");
    }
    long snapshotId = node.get("snapshot_id").asLong();
    String level = node.path("isolation_level").asText("");
    if (!level.isEmpty() && isolationLevel(level) == null) {
      throw new IllegalArgumentException("'handover' has isolation_level " + level + ", not a Kafka level");
    }
    String topicId = node.path("topic_id").asText("");
    return new Handover(
        topic,
        cluster,
        snapshotId,
        offsets(topic, node.path("offsets")),
        level.isEmpty() ? null : level,
        topicId.isEmpty() ? null : topicId);
  }

  /** Spark's Kafka offsets of the hand-over, {@code {"<topic>":{"0":1174,"1":800}}}, partitions ascending. */
  String startingOffsets() {
    return startingOffsets(topic, offsets);
  }

  private static String startingOffsets(String topic, SortedMap<Integer, Long> offsets) {
    ObjectNode root = JSON.createObjectNode();
    ObjectNode partitions = root.putObject(topic);
    offsets.forEach((partition, offset) -> partitions.put(Integer.toString(partition), offset));
    return root.toString();
  }

  /**
   * Refuses this hand-over when Kafka no longer holds it, asking Kafka at the level the archive was read
   * with; {@code when} says when the check is made.
   */
  void check(Map<String, String> kafkaOptions, String when) {
    check(kafkaOptions, topic, offsets, when, isolationLevel, topicId);
  }

  /**
   * Refuses, as the source does at start and at the switch, the hand-over of a plan's {@code "handover"}
   * document when Kafka no longer holds it: Kafka is asked at the document's isolation level, else at the
   * options' level.
   */
  public static void checkPlanned(Map<String, String> kafkaOptions, String handoverJson, String when) {
    JsonNode node;
    try {
      node = JSON.readTree(handoverJson == null ? "" : handoverJson);
    } catch (IOException e) {
      throw new IllegalArgumentException("hand-over " + handoverJson + " is not JSON", e);
    }
    of(node).check(kafkaOptions, when);
  }

  /**
   * Refuses, with an IllegalStateException, a hand-over that Kafka no longer holds. The message names the
   * topic, the partition, the hand-over offset, the earliest offset Kafka still has and its next offset:
   * {@code "<topic>: <when>: Kafka no longer holds the hand-over offset: topic playback partition 0,
   * hand-over offset 3, earliest offset 5, next offset 8"}.
   *
   * @param kafkaOptions Spark Kafka source options; those starting with {@code kafka.} configure the
   *     admin client that asks Kafka, the prefix stripped
   * @param topic the hand-over's topic
   * @param offsetsJson the next offset per partition, {@code {"0":1174,"1":800}}, or the same as Spark's
   *     Kafka offsets, {@code {"<topic>":{"0":1174,"1":800}}}
   * @param when when the check is made, for the message: "at start", "at the switch"
   */
  public static void check(Map<String, String> kafkaOptions, String topic, String offsetsJson, String when) {
    if (topic == null || topic.isEmpty()) {
      throw new IllegalArgumentException("a hand-over check needs the topic");
    }
    JsonNode node;
    try {
      node = JSON.readTree(offsetsJson == null ? "" : offsetsJson);
    } catch (IOException e) {
      throw new IllegalArgumentException("hand-over offsets " + offsetsJson + " are not JSON", e);
    }
    if (node != null && node.size() == 1 && node.has(topic) && node.get(topic).isObject()) {
      node = node.get(topic);
    }
    check(kafkaOptions, topic, offsets(topic, node), when, null, null);
  }

  private static void check(
      Map<String, String> kafkaOptions,
      String topic,
      SortedMap<Integer, Long> offsets,
      String when,
      String level,
      String topicId) {
    String prefix = topic + ": " + when + ": ";
    Properties config = adminConfig(kafkaOptions);
    IsolationLevel asked = level != null ? isolationLevel(level) : isolationLevel(config);
    if (!config.containsKey("bootstrap.servers")) {
      throw new IllegalArgumentException(
          prefix + "the hand-over offsets cannot be checked without option kafka.bootstrap.servers");
    }
    try (Admin admin = Admin.create(config)) {
      TopicDescription description = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
      Uuid id = description.topicId();
      String currentId = id == null || Uuid.ZERO_UUID.equals(id) ? null : id.toString();
      if (topicId != null && currentId != null && !topicId.equals(currentId)) {
        throw new IllegalStateException(String.format(
            "%sKafka's topic %s has id %s, and the router commit of the hand-over records id %s: the topic"
                + " was deleted and created again, and its offsets started over, so %s is not where the"
                + " archive ends in it. Run the application live, or bootstrap it from an archive of the new"
                + " topic",
            prefix, topic, currentId, topicId, startingOffsets(topic, offsets)));
      }
      TreeSet<Integer> partitions = new TreeSet<>();
      for (TopicPartitionInfo partition : description.partitions()) {
        partitions.add(partition.partition());
      }
      Map<TopicPartition, OffsetSpec> earliest = new HashMap<>();
      Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
      for (Map.Entry<Integer, Long> entry : offsets.entrySet()) {
        if (!partitions.contains(entry.getKey())) {
          throw new IllegalStateException(String.format(
              "%sKafka no longer holds the hand-over offset: topic %s partition %d, hand-over offset %d:"
                  + " the topic has no partition %d (its partitions: %s)",
              prefix, topic, entry.getKey(), entry.getValue(), entry.getKey(), partitions));
        }
        TopicPartition partition = new TopicPartition(topic, entry.getKey());
        earliest.put(partition, OffsetSpec.earliest());
        latest.put(partition, OffsetSpec.latest());
      }
      ListOffsetsOptions options = new ListOffsetsOptions(asked);
      Map<TopicPartition, ListOffsetsResultInfo> first = admin.listOffsets(earliest, options).all().get();
      Map<TopicPartition, ListOffsetsResultInfo> next = admin.listOffsets(latest, options).all().get();
      for (Map.Entry<Integer, Long> entry : offsets.entrySet()) {
        TopicPartition partition = new TopicPartition(topic, entry.getKey());
        long low = first.get(partition).offset();
        long high = next.get(partition).offset();
        if (entry.getValue() < low || entry.getValue() > high) {
          // Past the next offset: at this level Kafka has not reached it (an open transaction), or the
          // topic was deleted and created again.
          String how = entry.getValue() < low ? "no longer holds" : "has not reached";
          throw new IllegalStateException(String.format(
              "%sKafka %s the hand-over offset: topic %s partition %d, hand-over offset %d,"
                  + " earliest offset %d, next offset %d",
              prefix, how, topic, entry.getKey(), entry.getValue(), low, high));
        }
      }
    } catch (ExecutionException e) {
      if (e.getCause() instanceof UnknownTopicOrPartitionException) {
        throw new IllegalStateException(
            prefix + "Kafka has no topic " + topic + " to read on from the hand-over offsets "
                + startingOffsets(topic, offsets), e.getCause());
      }
      Throwable cause = e.getCause() == null ? e : e.getCause();
      throw new IllegalStateException(
          prefix + "cannot check the hand-over offsets " + startingOffsets(topic, offsets)
              + " against Kafka: " + cause, cause);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(prefix + "interrupted while checking the hand-over offsets", e);
    }
  }

  /**
   * Partition -> next offset from {@code {"0":1174,"1":800}}: every partition a number as Kafka writes it
   * ("1", never "01" or "+1", so that no two keys name one partition), every offset a whole number.
   */
  private static SortedMap<Integer, Long> offsets(String topic, JsonNode node) {
    if (node == null || !node.isObject() || node.isEmpty()) {
      throw new IllegalArgumentException(
          "the hand-over of topic " + topic + " needs its next offset per partition, {\"0\": 1174, ...}");
    }
    SortedMap<Integer, Long> offsets = new TreeMap<>();
    for (Map.Entry<String, JsonNode> field : node.properties()) {
      int partition;
      try {
        partition = Integer.parseInt(field.getKey());
      } catch (NumberFormatException e) {
        partition = -1;
      }
      if (!String.valueOf(partition).equals(field.getKey())) {
        partition = -1;
      }
      JsonNode offset = field.getValue();
      if (partition < 0 || !offset.isIntegralNumber() || !offset.canConvertToLong() || offset.asLong() < 0) {
        throw new IllegalArgumentException(
            "the hand-over of topic " + topic + " has " + field.getKey() + ": " + field.getValue()
                + ", not a partition and its next offset");
      }
      offsets.put(partition, field.getValue().asLong());
    }
    return offsets;
  }

  /** The admin client's settings: the {@code kafka.*} options, prefix stripped, as Spark's has them. */
  private static Properties adminConfig(Map<String, String> kafkaOptions) {
    Properties config = new Properties();
    if (kafkaOptions != null) {
      kafkaOptions.forEach((key, value) -> {
        if (key != null && value != null && key.toLowerCase(Locale.ROOT).startsWith(KAFKA_PREFIX)) {
          config.put(key.substring(KAFKA_PREFIX.length()), value);
        }
      });
    }
    return config;
  }

  /**
   * The next offsets Spark's Kafka source sees with these settings: the last stable offsets when it reads
   * committed records (bergstream sets that by default), the high watermarks when it reads uncommitted
   * ones (Kafka's consumers' default, where nothing is set).
   */
  private static IsolationLevel isolationLevel(Properties config) {
    Object level = config.get("isolation.level");
    IsolationLevel named = level == null ? null : isolationLevel(level.toString());
    return named == null ? IsolationLevel.READ_UNCOMMITTED : named;
  }

  /** {@code read_committed} or {@code read_uncommitted}, any case; null for anything else. */
  private static IsolationLevel isolationLevel(String level) {
    switch (level.trim().toLowerCase(Locale.ROOT)) {
      case "read_committed":
        return IsolationLevel.READ_COMMITTED;
      case "read_uncommitted":
        return IsolationLevel.READ_UNCOMMITTED;
      default:
        return null;
    }
  }
}
