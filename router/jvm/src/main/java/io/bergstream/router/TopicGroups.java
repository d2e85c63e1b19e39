package io.bergstream.router;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.Partition;
import org.apache.spark.rdd.PartitionCoalescer;
import org.apache.spark.rdd.PartitionGroup;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.execution.datasources.v2.DataSourceRDDPartition;
import org.apache.spark.sql.kafka010.KafkaBatchInputPartition;
import scala.Option;

/**
 * The tasks of a batch's job, each a group of the Kafka source's partitions in which a topic's partitions
 * are read by as many tasks as the topic's records are worth ({@code shares}: its {@code
 * records_per_write_task}, and one for a topic not named): a task writes a file per topic and hour it has
 * rows of, so a small topic read by one task is written in one file an hour, however its partitions fall.
 * Topics are placed largest first, each of a topic's parts on the task with the fewest records so far,
 * never two parts of a topic on one task. Partitions that are not the Kafka source's (a batch read into
 * memory first) are spread one by one.
 */
final class TopicGroups implements PartitionCoalescer, Serializable {
  private static final long serialVersionUID = 1L;

  /**
   * Records per Kafka partition under which a batch's reads are interpreted: the projection's code costs
   * about 3 ms a partition read (bench/topics' profile at 100 topics), the interpreted projection a fraction
   * of a microsecond more a record.
   */
  static final int SMALL_READ = 2_000;

  private final Map<String, Integer> shares;

  TopicGroups(Map<String, Integer> shares) {
    this.shares = Map.copyOf(shares);
  }

  /** A partition of the batch's read: its topic (null: not the Kafka source's) and its records. */
  record Part(String topic, long records) {}

  @Override
  public PartitionGroup[] coalesce(int maxPartitions, RDD<?> parent) {
    Partition[] partitions = parent.partitions();
    List<Part> parts = new ArrayList<>(partitions.length);
    for (Partition partition : partitions) {
      KafkaBatchInputPartition kafka = kafkaPartition(partition);
      parts.add(kafka == null
          ? new Part(null, 1)
          : new Part(kafka.offsetRange().topicPartition().topic(), Math.max(1, kafka.offsetRange().size())));
    }
    List<PartitionGroup> groups = new ArrayList<>();
    for (List<Integer> group : groups(parts, maxPartitions, shares)) {
      PartitionGroup made = new PartitionGroup(Option.empty());
      for (int index : group) {
        made.partitions().$plus$eq(partitions[index]);
      }
      groups.add(made);
    }
    return groups.toArray(new PartitionGroup[0]);
  }

  /**
   * The indexes of {@code parts} in each of at most {@code most} tasks, empty tasks left out: each topic's
   * parts in {@code shares.get(topic)} tasks at most (one when not named), balanced by records.
   */
  static List<List<Integer>> groups(List<Part> parts, int most, Map<String, Integer> shares) {
    int count = Math.max(1, Math.min(most, parts.size()));
    Map<String, List<Integer>> byTopic = new LinkedHashMap<>();
    Map<String, Long> records = new LinkedHashMap<>();
    for (int i = 0; i < parts.size(); i++) {
      Part part = parts.get(i);
      String topic = part.topic() == null ? "\u0000" + i : part.topic();
      byTopic.computeIfAbsent(topic, key -> new ArrayList<>()).add(i);
      records.merge(topic, part.records(), Long::sum);
    }
    List<List<Integer>> groups = new ArrayList<>(count);
    long[] load = new long[count];
    for (int i = 0; i < count; i++) {
      groups.add(new ArrayList<>());
    }
    List<String> topics = new ArrayList<>(byTopic.keySet());
    topics.sort(Comparator.comparingLong((String topic) -> records.get(topic)).reversed());
    for (String topic : topics) {
      List<Integer> own = byTopic.get(topic);
      int wanted = Math.max(1, shares.getOrDefault(topic, 1));
      int split = Math.min(Math.min(wanted, own.size()), count);
      // The topic's partitions in `split` parts of about equal records, the largest partitions first.
      List<List<Integer>> pieces = new ArrayList<>(split);
      long[] pieceLoad = new long[split];
      for (int i = 0; i < split; i++) {
        pieces.add(new ArrayList<>());
      }
      List<Integer> bySize = new ArrayList<>(own);
      bySize.sort(Comparator.comparingLong((Integer index) -> parts.get(index).records()).reversed());
      for (int index : bySize) {
        int lightest = lightest(pieceLoad, new boolean[split]);
        pieces.get(lightest).add(index);
        pieceLoad[lightest] += parts.get(index).records();
      }
      // Each part on the lightest task the topic is not on yet.
      boolean[] taken = new boolean[count];
      for (int i = 0; i < split; i++) {
        int task = lightest(load, taken);
        taken[task] = true;
        for (int index : pieces.get(i)) {
          groups.get(task).add(index);
        }
        load[task] += pieceLoad[i];
      }
    }
    groups.removeIf(List::isEmpty);
    for (List<Integer> group : groups) {
      group.sort(Integer::compare);
    }
    return groups;
  }

  /** The index of the least of {@code load} that is not {@code taken}. */
  private static int lightest(long[] load, boolean[] taken) {
    int lightest = -1;
    for (int i = 0; i < load.length; i++) {
      if (!taken[i] && (lightest < 0 || load[i] < load[lightest])) {
        lightest = i;
      }
    }
    return lightest;
  }

  /**
   * Whether the Kafka source's {@code partitions} of a batch hold fewer than {@link #SMALL_READ} records
   * each on average: reading one starts with the code of its rows' projection generated and looked up, a few
   * milliseconds, which the interpreted projection saves for less than that many rows.
   */
  static boolean smallReads(Partition[] partitions) {
    long records = 0;
    int reads = 0;
    for (Partition partition : partitions) {
      KafkaBatchInputPartition kafka = kafkaPartition(partition);
      if (kafka != null) {
        records += Math.max(0, kafka.offsetRange().size());
        reads++;
      }
    }
    return smallReads(records, reads);
  }

  /** Whether {@code reads} of the Kafka source holding {@code records} in all are each small on average. */
  static boolean smallReads(long records, int reads) {
    return reads > 1 && records < (long) SMALL_READ * reads;
  }

  /** The Kafka source's partition a task of the batch reads, or null for any other partition. */
  private static KafkaBatchInputPartition kafkaPartition(Partition partition) {
    if (partition instanceof DataSourceRDDPartition source && source.inputPartitions().size() == 1) {
      InputPartition input = source.inputPartitions().head();
      if (input instanceof KafkaBatchInputPartition kafka) {
        return kafka;
      }
    }
    return null;
  }
}
