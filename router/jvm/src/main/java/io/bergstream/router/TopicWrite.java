package io.bergstream.router;

import java.util.Map;

/**
 * One topic's part of a batch's write, as the driver hands it over: the plan of its rows, its archive and
 * dead-letter tables, whether each holds the batch already (a replay: its rows are counted, not written),
 * and the snapshot summary its commit carries (the query's and the batch's ids, and the Kafka range from its
 * oldest file not yet committed to the end of this batch).
 */
public final class TopicWrite {
  final String topic;
  final TopicRows rows;
  final String archive;
  final String deadLetters;
  final boolean archiveHolds;
  final boolean deadLettersHold;
  final Map<String, String> properties;

  public TopicWrite(String topic, TopicRows rows, String archive, String deadLetters, boolean archiveHolds,
      boolean deadLettersHold, Map<String, String> properties) {
    this.topic = topic;
    this.rows = rows;
    this.archive = archive;
    this.deadLetters = deadLetters;
    this.archiveHolds = archiveHolds;
    this.deadLettersHold = deadLettersHold;
    this.properties = Map.copyOf(properties);
  }

  /** The archive table's name when the batch writes it; null when it holds the batch already, or none. */
  String writtenArchive() {
    return archiveHolds ? null : archive;
  }

  String writtenDeadLetters() {
    return deadLettersHold ? null : deadLetters;
  }
}
