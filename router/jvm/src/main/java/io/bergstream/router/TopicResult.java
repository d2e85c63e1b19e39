package io.bergstream.router;

import java.io.Serializable;
import java.util.HashMap;
import java.util.Map;

/** What one topic's part of the batch came to, for its accounting. */
public final class TopicResult implements Serializable {
  private static final long serialVersionUID = 1L;
  public final String topic;
  public long archived;
  public long deadLettered;
  public long archiveFiles;
  public long archiveBytes;
  public long deadLetterFiles;
  public long deadLetterBytes;
  /** How long each table's commit took, in microseconds; 0 for a table that had nothing to commit. */
  public long archiveCommitMicros;
  public long deadLetterCommitMicros;
  /** The newest ingestion time read, in microseconds; Long.MIN_VALUE when none. */
  public long newestMicros = Long.MIN_VALUE;
  /** The oldest ingestion time read, in microseconds; Long.MAX_VALUE when none. */
  public long oldestMicros = Long.MAX_VALUE;
  /** The size of the archive table's metadata file after its commit; 0 when it was not committed. */
  public long metadataBytes;
  /** Per Kafka partition: {records read, first offset, last offset}. */
  public final Map<Integer, long[]> partitions = new HashMap<>();
  /** Why the topic was not written, or its commits failed; null when they succeeded. */
  public String error;
  /** The failure of a commit, for a caller that waits it out; null when none (or the topic was refused). */
  transient RuntimeException failure;
  /**
   * Another router's commit covering offsets this batch covers (SecondWriters), found before the write
   * (the topic is not written) or, with {@link #committedBeside}, after its commit; null when none.
   */
  public String secondWriter;
  public boolean committedBeside;

  TopicResult(String topic) {
    this.topic = topic;
  }

  void read(int partition, long offset) {
    long[] range = partitions.get(partition);
    if (range == null) {
      partitions.put(partition, new long[] {1, offset, offset});
    } else {
      range[0] += 1;
      range[1] = Math.min(range[1], offset);
      range[2] = Math.max(range[2], offset);
    }
  }

  void add(TopicResult other) {
    archived += other.archived;
    deadLettered += other.deadLettered;
    newestMicros = Math.max(newestMicros, other.newestMicros);
    oldestMicros = Math.min(oldestMicros, other.oldestMicros);
    other.partitions.forEach(
        (partition, range) -> {
          long[] mine = partitions.get(partition);
          if (mine == null) {
            partitions.put(partition, range.clone());
          } else {
            mine[0] += range[0];
            mine[1] = Math.min(mine[1], range[1]);
            mine[2] = Math.max(mine[2], range[2]);
          }
        });
  }

  /**
   * {archived, dead-lettered, archive files and bytes, dead-letter files and bytes, newest micros, the
   * archive's and the dead letters' commit micros, oldest micros, the archive's metadata file's bytes}.
   */
  public long[] totals() {
    return new long[] {
      archived, deadLettered, archiveFiles, archiveBytes, deadLetterFiles, deadLetterBytes, newestMicros,
      archiveCommitMicros, deadLetterCommitMicros, oldestMicros, metadataBytes
    };
  }
}
