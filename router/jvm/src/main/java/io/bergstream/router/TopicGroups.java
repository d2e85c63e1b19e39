package io.bergstream.router;

import java.io.Serializable;
import java.util.ArrayList;
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
 * stay together: a task writes a file per topic and hour it has rows of, so a topic read by one task is
 * written in one file an hour instead of one per task. Topics are spread over the tasks by their records,
 * the largest first, each to the task with the fewest so far; a topic with more records than a task's
 * share is spread by partition, as Spark's coalescing would. Partitions that are not the Kafka source's
 * (a batch read into memory first) are spread one by one.
 */
final class TopicGroups implements PartitionCoalescer, Serializable {
  private static final long serialVersionUID = 1L;

  @Override
  public PartitionGroup[] coalesce(int maxPartitions, RDD<?> parent) {
    Partition[] partitions = parent.partitions();
    int count = Math.max(1, Math.min(maxPartitions, partitions.length));
    Map<String, List<Partition>> byTopic = new LinkedHashMap<>();
    Map<String, Long> records = new LinkedHashMap<>();
    long total = 0;
    for (Partition partition : partitions) {
      KafkaBatchInputPartition kafka = kafkaPartition(partition);
      String topic = kafka == null ? "#" + partition.index() : kafka.offsetRange().topicPartition().topic();
      long size = kafka == null ? 1 : Math.max(1, kafka.offsetRange().size());
      byTopic.computeIfAbsent(topic, key -> new ArrayList<>()).add(partition);
      records.merge(topic, size, Long::sum);
      total += size;
    }
    PartitionGroup[] groups = new PartitionGroup[count];
    long[] load = new long[count];
    for (int i = 0; i < count; i++) {
      groups[i] = new PartitionGroup(Option.empty());
    }
    long share = Math.max(1, total / count);
    List<String> topics = new ArrayList<>(byTopic.keySet());
    topics.sort((a, b) -> Long.compare(records.get(b), records.get(a)));
    for (String topic : topics) {
      List<Partition> own = byTopic.get(topic);
      if (records.get(topic) > share && own.size() > 1) {
        for (Partition partition : own) {
          KafkaBatchInputPartition kafka = kafkaPartition(partition);
          int lightest = lightest(load);
          groups[lightest].partitions().$plus$eq(partition);
          load[lightest] += kafka == null ? 1 : Math.max(1, kafka.offsetRange().size());
        }
      } else {
        int lightest = lightest(load);
        for (Partition partition : own) {
          groups[lightest].partitions().$plus$eq(partition);
        }
        load[lightest] += records.get(topic);
      }
    }
    List<PartitionGroup> used = new ArrayList<>();
    for (PartitionGroup group : groups) {
      if (group.numPartitions() > 0) {
        used.add(group);
      }
    }
    return used.toArray(new PartitionGroup[0]);
  }

  private static int lightest(long[] load) {
    int lightest = 0;
    for (int i = 1; i < load.length; i++) {
      if (load[i] < load[lightest]) {
        lightest = i;
      }
    }
    return lightest;
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
