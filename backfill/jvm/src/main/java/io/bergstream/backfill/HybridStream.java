package io.bergstream.backfill;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReportsSourceMetrics;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;

/**
 * A plan's archive epochs, then its topic from the hand-over offsets, as one stream of micro-batches.
 *
 * <p>Archive phase: exactly as {@code bergstream-backfill}, one epoch per micro-batch whatever the
 * trigger (the source paces itself; Spark's read limit does not apply). The hand-over is checked
 * against Kafka on the first archive micro-batch of each run, and again at the switch: a hand-over
 * offset Kafka no longer holds is refused ({@link Handover#check}).
 *
 * <p>The switch: once every epoch is emitted, the next micro-batch reads Kafka from the hand-over
 * offsets. It always runs, even when Kafka holds nothing new, so the switch shows in the offset log and
 * the progress (start {@code {"phase":"archive",...}}, end {@code {"phase":"kafka",...}}). A partition
 * the hand-over lacks (added to the topic since) is read from its earliest offset.
 *
 * <p>Kafka phase: Spark's own Kafka stream, with the options given to the source. Its read limit
 * ({@code maxOffsetsPerTrigger}, {@code minOffsetsPerTrigger} and {@code maxTriggerDelay}) applies,
 * its metrics are reported beside this source's, and it reads with {@code failOnDataLoss} as given, but
 * for the switch micro-batch: until it is committed, the hand-over is what the bootstrap promised to
 * read exactly, so an offset of its range that Kafka no longer holds fails the query. The switch
 * micro-batch is planned after a check of the hand-over (also when Spark replays it from the offset log
 * after a restart, without asking for a latest offset), and read by a Kafka stream of its own that fails
 * on data loss, for offsets that expire between its planning and its reading.
 *
 * <p>With an availableNow trigger, the archive phase emits one epoch per micro-batch, as with any other
 * trigger, and the Kafka phase reads up to the end Kafka had at the switch (or, after a restart in the
 * Kafka phase, at its first Kafka micro-batch): Kafka's target is fixed then, not when the query
 * started, and the query stops once it is reached. Trigger.Once reads a single micro-batch: it is not
 * meant for this source.
 *
 * <p>Restarts: Spark replays a micro-batch whose offsets were logged but not committed from the logged
 * offsets alone, without asking for the latest offset; the switch micro-batch is replayed from the
 * hand-over to its logged Kafka end. Kafka's metrics are only asked for once Kafka's latest offset has
 * been fetched in this run (Spark's Kafka stream fails otherwise, SPARK-55271). Spark's Kafka stream is
 * never asked for its initial offset: it starts from the hand-over, and writes nothing of its own to
 * the checkpoint.
 *
 * <p>Every method but toString runs on the query's stream execution thread, as Spark's Kafka stream
 * requires; toString, the progress description, may be read from any thread.
 */
final class HybridStream implements MicroBatchStream, SupportsTriggerAvailableNow, ReportsSourceMetrics {
  private final Plan plan;
  private final EpochStream archive;
  private final MicroBatchStream kafka;
  // The same Kafka stream with failOnDataLoss: what plans the switch micro-batch.
  private final MicroBatchStream switchKafka;
  private final Map<String, String> kafkaOptions;
  private final int kafkaColumns;
  private Offset handover;
  private boolean availableNow;
  private boolean kafkaPrepared;
  // Whether Kafka's latest offset was fetched in this run: its metrics need it (SPARK-55271).
  private boolean kafkaFetched;
  private boolean checkedAtStart;
  // What the last planned micro-batch reads, for its reader factory.
  private boolean plannedArchive;
  private boolean plannedKafka;
  private boolean plannedSwitch;
  // The furthest offset returned or read back: what the progress description shows.
  private volatile HybridOffset furthest;

  HybridStream(
      Plan plan,
      EpochStream archive,
      MicroBatchStream kafka,
      MicroBatchStream switchKafka,
      Map<String, String> kafkaOptions,
      int kafkaColumns) {
    if (!(kafka instanceof SupportsAdmissionControl)) {
      throw new IllegalStateException("Spark's Kafka stream " + kafka + " takes no read limit");
    }
    this.plan = plan;
    this.archive = archive;
    this.kafka = kafka;
    this.switchKafka = switchKafka;
    this.kafkaOptions = kafkaOptions;
    this.kafkaColumns = kafkaColumns;
  }

  @Override
  public Offset initialOffset() {
    return seen(HybridOffset.archive(0, plan));
  }

  @Override
  public Offset deserializeOffset(String json) {
    return seen(HybridOffset.parse(json, plan, kafka::deserializeOffset));
  }

  /** Offsets come back from the checkpoint's log, or in Spark's own serialized form, as JSON. */
  private HybridOffset offsetOf(Offset offset) {
    return offset instanceof HybridOffset hybrid
        ? hybrid
        : HybridOffset.parse(offset.json(), plan, kafka::deserializeOffset);
  }

  private HybridOffset seen(HybridOffset offset) {
    if (offset.notBefore(furthest)) {
      furthest = offset;
    }
    return offset;
  }

  /** Kafka's offset of the hand-over: where the switch micro-batch starts reading Kafka. */
  private Offset handover() {
    if (handover == null) {
      handover = kafka.deserializeOffset(plan.handover.startingOffsets());
    }
    return handover;
  }

  @Override
  public Offset latestOffset() {
    throw new UnsupportedOperationException("bergstream-hybrid paces itself: latestOffset(start, limit)");
  }

  /** Spark's read limit is ignored: one epoch per micro-batch in the archive, Kafka's own limit after. */
  @Override
  public Offset latestOffset(Offset startOffset, ReadLimit limit) {
    HybridOffset start = offsetOf(startOffset);
    Offset from;
    if (start.inArchive()) {
      if (start.epoch() < plan.size()) {
        if (!checkedAtStart) {
          plan.handover.check(kafkaOptions, "at start");
          checkedAtStart = true;
        }
        return seen(HybridOffset.archive(start.epoch() + 1, plan));
      }
      plan.handover.check(kafkaOptions, "at the switch");
      checkedAtStart = true;
      from = handover();
    } else {
      from = start.kafka;
    }
    SupportsAdmissionControl admission = (SupportsAdmissionControl) kafka;
    if (availableNow && !kafkaPrepared && kafka instanceof SupportsTriggerAvailableNow availableKafka) {
      // Just in time: Kafka fixes the end it reads up to on its first latest offset after this.
      availableKafka.prepareForTriggerAvailableNow();
      kafkaPrepared = true;
    }
    Offset end = admission.latestOffset(from, admission.getDefaultReadLimit());
    kafkaFetched = true;
    return seen(HybridOffset.kafka(end == null ? from : end, plan));
  }

  @Override
  public ReadLimit getDefaultReadLimit() {
    return ReadLimit.allAvailable();  // never applied: see latestOffset
  }

  @Override
  public Offset reportLatestOffset() {
    HybridOffset last = furthest;
    if (last == null || last.inArchive()) {
      return HybridOffset.archive(plan.size(), plan);
    }
    if (!kafkaFetched) {
      return null;  // Kafka's would fail: it knows its latest offset only once it has fetched it
    }
    Offset latest = ((SupportsAdmissionControl) kafka).reportLatestOffset();
    return latest == null ? null : HybridOffset.kafka(latest, plan);
  }

  /** Only noted here: Kafka is prepared when it is first read (see latestOffset). */
  @Override
  public void prepareForTriggerAvailableNow() {
    availableNow = true;
    archive.prepareForTriggerAvailableNow();
  }

  @Override
  public InputPartition[] planInputPartitions(Offset startOffset, Offset endOffset) {
    HybridOffset start = offsetOf(startOffset);
    HybridOffset end = offsetOf(endOffset);
    if (!start.inArchive() && end.inArchive()) {
      throw new IllegalStateException(
          "a micro-batch from Kafka offset " + start.json() + " back to the archive, " + end.json());
    }
    List<InputPartition> partitions = new ArrayList<>();
    plannedArchive = false;
    plannedKafka = false;
    plannedSwitch = false;
    if (start.inArchive()) {
      Offset upTo = end.inArchive() ? end.archive : new EpochOffset(plan.size(), plan);
      for (InputPartition epoch : archive.planInputPartitions(start.archive, upTo)) {
        partitions.add(HybridPartition.archive(epoch));
        plannedArchive = true;
      }
    }
    if (!end.inArchive()) {
      MicroBatchStream reads = kafka;
      Offset from = start.kafka;
      if (start.inArchive()) {
        plan.handover.check(kafkaOptions, "reading the switch micro-batch");
        plannedSwitch = true;
        reads = switchKafka;
        from = handover();
      }
      for (InputPartition range : reads.planInputPartitions(from, end.kafka)) {
        partitions.add(HybridPartition.kafka(range));
        plannedKafka = true;
      }
    }
    return partitions.toArray(new InputPartition[0]);
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new HybridReaderFactory(
        plannedArchive ? archive.createReaderFactory() : null,
        plannedKafka ? (plannedSwitch ? switchKafka : kafka).createReaderFactory() : null,
        kafkaColumns);
  }

  /**
   * phase, epoch, epochs, watermark, table, snapshot and handover; in the Kafka phase also Kafka's own
   * (min/max/avgOffsetsBehindLatest) once Kafka's latest offset was fetched in this run.
   */
  @Override
  public Map<String, String> metrics(Optional<Offset> latestConsumedOffset) {
    HybridOffset consumed = latestConsumedOffset.map(this::offsetOf).orElse(null);
    int epoch = consumed == null ? 0 : consumed.epoch();
    Map<String, String> metrics = new HashMap<>();
    metrics.put("phase", consumed == null ? HybridOffset.ARCHIVE : consumed.phase());
    metrics.put("epoch", Integer.toString(epoch));
    metrics.put("epochs", Integer.toString(plan.size()));
    metrics.put("watermark", Plan.instant(plan.watermark(epoch)));
    metrics.put("table", plan.table);
    metrics.put("snapshot", Long.toString(plan.handover.snapshotId));
    metrics.put("handover", plan.handover.startingOffsets());
    // SPARK-55271: Kafka's metrics fail until Kafka's latest offset is fetched, as in a replayed micro-batch.
    boolean kafkaKnowsLatest = consumed != null && !consumed.inArchive() && kafkaFetched;
    if (kafkaKnowsLatest && kafka instanceof ReportsSourceMetrics reports) {
      metrics.putAll(reports.metrics(Optional.of(consumed.kafka)));
    }
    return metrics;
  }

  @Override
  public void commit(Offset end) {
    HybridOffset committed = offsetOf(end);
    if (committed.inArchive()) {
      archive.commit(committed.archive);
    } else {
      kafka.commit(committed.kafka);
    }
  }

  @Override
  public void stop() {
    try {
      kafka.stop();
      switchKafka.stop();
    } finally {
      archive.stop();
    }
  }

  @Override
  public String toString() {
    HybridOffset at = furthest;
    String where = at == null || at.inArchive()
        ? "archive epoch " + (at == null ? 0 : at.epoch()) + "/" + plan.size() + " of " + plan.table
        : "kafka " + plan.handover.topic + " from hand-over (snapshot " + plan.handover.snapshotId + ")";
    return "bergstream-hybrid[" + plan.source + ": " + where + "]";
  }
}
