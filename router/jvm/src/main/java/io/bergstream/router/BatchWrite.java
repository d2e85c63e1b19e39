package io.bergstream.router;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.Table;

/**
 * A batch's files as written (TopicTables.write), each topic's outcome, and where its time went. The driver
 * reads the outcomes ({@link #json}), then commits every topic written ({@link #commit}).
 */
public final class BatchWrite {
  final List<TopicWrite> writes;
  final List<TopicResult> outcomes;
  final List<Table> archives;
  final List<Table> deadLetters;
  final List<List<DataFile>> archiveFiles;
  final List<List<DataFile>> deadLetterFiles;
  private final SecondWriters.Keys keys;
  private final long tablesMillis;
  private final long jobMillis;
  private long commitMillis;

  BatchWrite(List<TopicWrite> writes, List<TopicResult> outcomes, List<Table> archives,
      List<Table> deadLetters, List<List<DataFile>> archiveFiles, List<List<DataFile>> deadLetterFiles,
      SecondWriters.Keys keys, long tablesMillis, long jobMillis) {
    this.writes = writes;
    this.outcomes = outcomes;
    this.archives = archives;
    this.deadLetters = deadLetters;
    this.archiveFiles = archiveFiles;
    this.deadLetterFiles = deadLetterFiles;
    this.keys = keys;
    this.tablesMillis = tablesMillis;
    this.jobMillis = jobMillis;
  }

  /**
   * Every topic's outcome as one JSON document, read by Python in one call instead of a dozen per topic:
   * [{"error", "second_writer", "committed_beside", "totals": [archived, dead-lettered, archive files,
   * archive bytes, dead-letter files, dead-letter bytes, newest micros, archive commit micros, dead-letter
   * commit micros, oldest micros], "partitions": {partition: [read, first, last]}}, ...].
   */
  public String json() throws IOException {
    List<Map<String, Object>> listed = new ArrayList<>(outcomes.size());
    for (TopicResult outcome : outcomes) {
      Map<String, Object> one = new HashMap<>();
      one.put("error", outcome.error);
      one.put("second_writer", outcome.secondWriter);
      one.put("committed_beside", outcome.committedBeside);
      one.put("totals", outcome.totals());
      one.put("partitions", outcome.partitions);
      listed.add(one);
    }
    return new ObjectMapper().writeValueAsString(listed);
  }

  /**
   * Commits topics {@code topics}: each table's files of this batch in one append with the topic's
   * summary, the archive table before the dead-letter table; at most {@code threads} topics at once. A topic
   * whose commit fails has the reason in its outcome (the others are committed regardless).
   */
  public void commit(List<Integer> topics, int threads) throws Exception {
    long began = System.nanoTime();
    ExecutorService pool = Executors.newFixedThreadPool(Math.max(1, Math.min(threads, topics.size())));
    try {
      List<Future<?>> commits = new ArrayList<>(topics.size());
      for (int i : topics) {
        if (outcomes.get(i).error != null) {
          continue;
        }
        commits.add(pool.submit(() -> commitOne(i)));
      }
      for (Future<?> commit : commits) {
        commit.get();
      }
    } finally {
      pool.shutdown();
    }
    commitMillis += (System.nanoTime() - began) / 1_000_000;
  }

  private void commitOne(int index) {
    TopicWrite topic = writes.get(index);
    TopicResult outcome = outcomes.get(index);
    try {
      long began = System.nanoTime();
      Table archive = archives.get(index);
      if (archive != null) {
        long[] archived = PendingFiles.append(
            archive, files(archiveFiles.get(index), topic.writtenArchive() != null), topic.properties);
        outcome.archiveCommitMicros = archived[0] > 0 ? (System.nanoTime() - began) / 1000 : 0;
        if (archived[0] > 0) {
          outcome.metadataBytes = PendingFiles.metadataBytes(archive);
          // Two routers committing at the same moment did not see each other before.
          archive.refresh();
          outcome.secondWriter = SecondWriters.overlapping(archive, topic.properties, keys, true);
          outcome.committedBeside = outcome.secondWriter != null;
        }
      }
      began = System.nanoTime();
      Table deadLetter = deadLetters.get(index);
      if (deadLetter != null) {
        long[] dead = PendingFiles.append(deadLetter,
            files(deadLetterFiles.get(index), topic.writtenDeadLetters() != null), topic.properties);
        outcome.deadLetterCommitMicros = dead[0] > 0 ? (System.nanoTime() - began) / 1000 : 0;
      }
    } catch (RuntimeException error) {
      outcome.error = error.toString();
      outcome.failure = error;
    }
  }

  /** What a table's commit appends: this batch's files; nothing when it holds the batch already (a replay). */
  private static List<DataFile> files(List<DataFile> written, boolean writes) {
    return writes ? written : List.of();
  }

  /**
   * Throws the failure of topic {@code index}'s commit, if it had one, for a caller that tells an outage
   * from an error and waits the outage out; a topic refused before the write (its tables cannot be written
   * this way, another router's commit) has none.
   */
  public void rethrow(int index) {
    RuntimeException failure = outcomes.get(index).failure;
    if (failure != null) {
      throw failure;
    }
  }

  /** Milliseconds loading the tables and planning each topic's rows; the write job; the commits. */
  public long[] millis() {
    return new long[] {tablesMillis, jobMillis, commitMillis};
  }
}
