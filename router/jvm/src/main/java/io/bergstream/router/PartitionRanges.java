package io.bergstream.router;

import java.io.Serializable;
import java.util.HashMap;
import java.util.Map;
import org.apache.spark.sql.Encoder;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.expressions.Aggregator;
import org.apache.spark.sql.functions;
import scala.Tuple2;

/**
 * What a micro-batch read from each Kafka partition: how many records, the first offset and the last, as
 * one aggregate over (partition, offset).
 *
 * <p>The cost per record does not depend on how many partitions the topic has, and the partitions need
 * not be known in advance: a partition added to the topic while the router runs is counted like the
 * others. Spark's Kafka source reads one partition per task, so the record almost always belongs to the
 * partition of the record before it, which is kept at hand.
 */
public final class PartitionRanges
    extends Aggregator<Tuple2<Integer, Long>, PartitionRanges.Ranges, PartitionRanges.Result> {
  private static final long serialVersionUID = 1L;

  /** The name the router calls the aggregate by in Spark SQL. */
  public static final String NAME = "bergstream_partition_ranges";

  /** Registers the aggregate in {@code spark}'s function registry; returns the name to call it by. */
  public static String register(SparkSession spark) {
    spark
        .udf()
        .register(
            NAME,
            functions.udaf(new PartitionRanges(), Encoders.tuple(Encoders.INT(), Encoders.LONG())));
    return NAME;
  }

  /** Per partition: {count, first offset, last offset}. */
  public static final class Ranges implements Serializable {
    private static final long serialVersionUID = 1L;
    final Map<Integer, long[]> byPartition = new HashMap<>();
    private transient int lastPartition = -1;
    private transient long[] last;

    void add(int partition, long count, long first, long lastOffset) {
      long[] range = partition == lastPartition && last != null ? last : byPartition.get(partition);
      if (range == null) {
        byPartition.put(partition, new long[] {count, first, lastOffset});
        range = byPartition.get(partition);
      } else {
        range[0] += count;
        range[1] = Math.min(range[1], first);
        range[2] = Math.max(range[2], lastOffset);
      }
      lastPartition = partition;
      last = range;
    }
  }

  /** Parallel arrays, one entry per partition read, in partition order. */
  public static final class Result implements Serializable {
    private static final long serialVersionUID = 1L;
    private int[] partitions = new int[0];
    private long[] counts = new long[0];
    private long[] firsts = new long[0];
    private long[] lasts = new long[0];

    public int[] getPartitions() {
      return partitions;
    }

    public void setPartitions(int[] partitions) {
      this.partitions = partitions;
    }

    public long[] getCounts() {
      return counts;
    }

    public void setCounts(long[] counts) {
      this.counts = counts;
    }

    public long[] getFirsts() {
      return firsts;
    }

    public void setFirsts(long[] firsts) {
      this.firsts = firsts;
    }

    public long[] getLasts() {
      return lasts;
    }

    public void setLasts(long[] lasts) {
      this.lasts = lasts;
    }
  }

  @Override
  public Ranges zero() {
    return new Ranges();
  }

  @Override
  public Ranges reduce(Ranges ranges, Tuple2<Integer, Long> record) {
    long offset = record._2();
    ranges.add(record._1(), 1, offset, offset);
    return ranges;
  }

  @Override
  public Ranges merge(Ranges into, Ranges other) {
    for (Map.Entry<Integer, long[]> entry : other.byPartition.entrySet()) {
      long[] range = entry.getValue();
      into.add(entry.getKey(), range[0], range[1], range[2]);
    }
    return into;
  }

  @Override
  public Result finish(Ranges ranges) {
    int[] partitions =
        ranges.byPartition.keySet().stream().mapToInt(Integer::intValue).sorted().toArray();
    long[] counts = new long[partitions.length];
    long[] firsts = new long[partitions.length];
    long[] lasts = new long[partitions.length];
    for (int i = 0; i < partitions.length; i++) {
      long[] range = ranges.byPartition.get(partitions[i]);
      counts[i] = range[0];
      firsts[i] = range[1];
      lasts[i] = range[2];
    }
    Result result = new Result();
    result.setPartitions(partitions);
    result.setCounts(counts);
    result.setFirsts(firsts);
    result.setLasts(lasts);
    return result;
  }

  @Override
  public Encoder<Ranges> bufferEncoder() {
    return Encoders.javaSerialization(Ranges.class);
  }

  @Override
  public Encoder<Result> outputEncoder() {
    return Encoders.bean(Result.class);
  }
}
