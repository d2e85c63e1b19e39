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
 * reads the outcomes ({@link #json}), then commits the topics that are due ({@link #commit}, each with what
 * is pending of its tables) and keeps the others' files pending ({@link #hold}).
 */
public final class BatchWrite {
  private final List<TopicWrite> writes;
  private final List<TopicResult> outcomes;
  private final List<Table> archives;
  private final List<Table> deadLetters;
  private final List<List<DataFile>> archiveFiles;
  private final List<List<DataFile>> deadLetterFiles;
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

  /** Keeps the files topics {@code topics} wrote as pending in {@code pending}, under batch {@code batch}. */
  public void hold(PendingFiles pending, long batch, List<Integer> topics) {
    for (int i : topics) {
      TopicWrite topic = writes.get(i);
      if (outcomes.get(i).error != null) {
        continue;
      }
      if (topic.writtenArchive() != null) {
        pending.keep(topic.archive, archives.get(i), batch, archiveFiles.get(i));
      }
      if (topic.writtenDeadLetters() != null) {
        pending.keep(topic.deadLetters, deadLetters.get(i), batch, deadLetterFiles.get(i));
      }
    }
  }

  /**
   * Commits topics {@code topics}: each table's files of this batch with those of it {@code pending} holds
   * (null: none), in one append with the topic's summary, the archive table before the dead-letter table;
   * at most {@code threads} topics at once. A topic whose commit fails has the reason in its outcome (the
   * others are committed regardless); its pending files stay pending.
   */
  public void commit(PendingFiles pending, List<Integer> topics, int threads) throws Exception {
    long began = System.nanoTime();
    ExecutorService pool = Executors.newFixedThreadPool(Math.max(1, Math.min(threads, topics.size())));
    try {
      List<Future<?>> commits = new ArrayList<>(topics.size());
      for (int i : topics) {
        if (outcomes.get(i).error != null) {
          continue;
        }
        commits.add(pool.submit(() -> commitOne(pending, i)));
      }
      for (Future<?> commit : commits) {
        commit.get();
      }
    } finally {
      pool.shutdown();
    }
    commitMillis += (System.nanoTime() - began) / 1_000_000;
  }

  private void commitOne(PendingFiles pending, int index) {
    TopicWrite topic = writes.get(index);
    TopicResult outcome = outcomes.get(index);
    long batch = Long.parseLong(topic.properties.get(keys.batchId()));
    try {
      long began = System.nanoTime();
      Table archive = archives.get(index);
      if (archive != null) {
        long[] archived = PendingFiles.append(archive, files(pending, topic.archive, archiveFiles.get(index),
            topic.writtenArchive() != null), topic.properties);
        if (pending != null) {
          pending.committed(topic.archive, batch);
        }
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
        long[] dead = PendingFiles.append(deadLetter, files(pending, topic.deadLetters,
            deadLetterFiles.get(index), topic.writtenDeadLetters() != null), topic.properties);
        if (pending != null) {
          pending.committed(topic.deadLetters, batch);
        }
        outcome.deadLetterCommitMicros = dead[0] > 0 ? (System.nanoTime() - began) / 1000 : 0;
      }
    } catch (RuntimeException error) {
      outcome.error = error.toString();
      outcome.failure = error;
    }
  }

  /**
   * What a table's commit appends: its pending files, then this batch's; nothing when it holds the batch
   * already (a replay: what was pending of it went in the commit of the batch, or before).
   */
  private static List<DataFile> files(PendingFiles pending, String table, List<DataFile> written,
      boolean writes) {
    if (!writes) {
      return List.of();
    }
    List<DataFile> all = pending == null ? new ArrayList<>() : pending.of(table);
    all.addAll(written);
    return all;
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
