package io.bergstream.backfill;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.LiteralValue;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownV2Filters;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReportsSourceMetrics;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The plan's epochs as micro-batches. The source paces itself: whatever the trigger, a micro-batch is
 * one epoch, so that applications see ingestion time advance in order; with Trigger.AvailableNow the
 * query stops after the last epoch. Each epoch is an Iceberg scan of the pinned snapshot with the
 * epoch's bounds pushed down, so that Iceberg skips the files and row groups outside it.
 */
final class EpochStream implements MicroBatchStream, SupportsTriggerAvailableNow, ReportsSourceMetrics {
  private static final String INGESTION_TS = ArchiveTable.METADATA + "." + ArchiveTable.INGESTION_TS;
  private static final String CLUSTER = ArchiveTable.METADATA + "." + ArchiveTable.CLUSTER;

  private final Plan plan;
  private final ArchiveTable archive;
  private final RowLayout layout;
  private int target;
  // The last planned micro-batch: Spark may plan the same one again (several actions in foreachBatch).
  private int plannedStart = -1;
  private int plannedEnd = -1;
  private InputPartition[] planned;
  private PartitionReaderFactory icebergFactory;

  EpochStream(Plan plan, ArchiveTable archive, RowLayout layout) {
    this.plan = plan;
    this.archive = archive;
    this.layout = layout;
    this.target = plan.size();
  }

  @Override
  public Offset initialOffset() {
    return EpochOffset.of(0, plan);
  }

  @Override
  public Offset deserializeOffset(String json) {
    return EpochOffset.parse(json, plan);
  }

  /** Spark asks latestOffset(start, limit) of a source with admission control; this is never the pace. */
  @Override
  public Offset latestOffset() {
    return reportLatestOffset();
  }

  /** One epoch past `start`, whatever the limit; `start` itself once the last epoch is emitted. */
  @Override
  public Offset latestOffset(Offset start, ReadLimit limit) {
    EpochOffset done = EpochOffset.of(start, plan);
    return done.epoch >= target ? done : EpochOffset.of(done.epoch + 1, plan);
  }

  @Override
  public ReadLimit getDefaultReadLimit() {
    return OneEpochPerBatch.INSTANCE;
  }

  @Override
  public Offset reportLatestOffset() {
    return EpochOffset.of(plan.size(), plan);
  }

  /** The plan is fixed, so what is available now is every epoch of it. */
  @Override
  public void prepareForTriggerAvailableNow() {
    target = plan.size();
  }

  @Override
  public synchronized InputPartition[] planInputPartitions(Offset start, Offset end) {
    int first = EpochOffset.of(start, plan).epoch;
    int last = EpochOffset.of(end, plan).epoch;
    if (first == plannedStart && last == plannedEnd) {
      return planned;
    }
    List<InputPartition> partitions = new ArrayList<>();
    for (int epoch = first; epoch < last; epoch++) {
      long lo = plan.low(epoch);
      long hi = plan.high(epoch);
      Batch batch = icebergBatch(lo, hi);
      icebergFactory = batch.createReaderFactory();
      for (InputPartition partition : batch.planInputPartitions()) {
        partitions.add(new EpochPartition(partition, epoch, lo, hi));
      }
    }
    planned = partitions.toArray(new InputPartition[0]);
    plannedStart = first;
    plannedEnd = last;
    return planned;
  }

  /**
   * Iceberg's row reader factory keeps no state of its scan; the one of the last planned epoch serves.
   * Should Spark ask before planning, an empty scan's factory is as good.
   */
  @Override
  public synchronized PartitionReaderFactory createReaderFactory() {
    if (icebergFactory == null) {
      icebergFactory = icebergBatch(plan.windowStart, plan.windowStart).createReaderFactory();
    }
    return new EpochReaderFactory(icebergFactory, layout, plan.regions);
  }

  /** Iceberg's batch for the epoch [lo, hi): its files and row groups that can hold rows of it. */
  private Batch icebergBatch(long lo, long hi) {
    ScanBuilder builder = archive.iceberg.newScanBuilder(BackfillScan.ICEBERG_READ_OPTIONS);
    if (!(builder instanceof SupportsPushDownV2Filters filters)) {
      throw new IllegalStateException("bergstream-backfill: Iceberg's scan of " + plan.table
          + " takes no predicates (" + builder.getClass().getName() + ")");
    }
    filters.pushPredicates(predicates(lo, hi));
    return builder.build().toBatch();
  }

  private Predicate[] predicates(long lo, long hi) {
    List<Predicate> predicates = new ArrayList<>();
    predicates.add(compare(">=", lo));
    predicates.add(compare("<", hi));
    if (plan.regions != null) {
      List<Expression> in = new ArrayList<>();
      in.add(Expressions.column(CLUSTER));
      for (String region : plan.regions) {
        in.add(new LiteralValue<>(UTF8String.fromString(region), DataTypes.StringType));
      }
      predicates.add(new Predicate("IN", in.toArray(new Expression[0])));
    }
    return predicates.toArray(new Predicate[0]);
  }

  private Predicate compare(String operator, long micros) {
    return new Predicate(operator, new Expression[] {
        Expressions.column(INGESTION_TS), new LiteralValue<>(micros, archive.ingestionTsType)});
  }

  /** Shown in StreamingQueryProgress.sources[].metrics. */
  @Override
  public Map<String, String> metrics(Optional<Offset> latestConsumedOffset) {
    int epoch = latestConsumedOffset.map(offset -> EpochOffset.of(offset, plan).epoch).orElse(0);
    Map<String, String> metrics = new LinkedHashMap<>();
    metrics.put("epoch", Integer.toString(epoch));
    metrics.put("epochs", Integer.toString(plan.size()));
    metrics.put("watermark", Plan.instant(plan.watermark(epoch)));
    metrics.put("table", plan.table);
    metrics.put("snapshot_id", String.valueOf(archive.snapshotId));
    return metrics;
  }

  @Override
  public void commit(Offset end) {}

  @Override
  public void stop() {}

  @Override
  public String toString() {
    return "bergstream-backfill[" + plan.source + ": " + plan.table + "@" + archive.snapshotId + "]";
  }
}
