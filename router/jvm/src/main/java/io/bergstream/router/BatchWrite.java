package io.bergstream.router;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import com.fasterxml.jackson.databind.ObjectMapper;

/** What a batch's write came to: each topic's outcome, and where its time went. */
public final class BatchWrite {
  private final List<TopicResult> outcomes;
  private final long tablesMillis;
  private final long jobMillis;
  private final long commitMillis;

  BatchWrite(List<TopicResult> outcomes, long tablesMillis, long jobMillis, long commitMillis) {
    this.outcomes = outcomes;
    this.tablesMillis = tablesMillis;
    this.jobMillis = jobMillis;
    this.commitMillis = commitMillis;
  }

  /**
   * Every topic's outcome as one JSON document, read by Python in one call instead of a dozen per topic:
   * [{"error", "totals": [archived, dead-lettered, archive files, archive bytes, dead-letter files,
   * dead-letter bytes, newest micros], "partitions": {partition: [read, first, last]}}, ...].
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
