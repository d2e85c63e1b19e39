package io.bergstream.backfill;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import org.apache.iceberg.FileScanTask;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.LiteralValue;
import org.apache.spark.sql.connector.expressions.NamedReference;
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
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The epochs of a plan as micro-batches. The source paces itself: whatever the trigger, each
 * micro-batch is one epoch, and with an availableNow trigger the query stops after the last one.
 * Iceberg plans the window's scan once; each epoch reads the splits of that scan whose files and row
 * groups may hold its rows, and the rows they still hold outside the epoch are dropped here.
 */
final class EpochStream implements MicroBatchStream, SupportsTriggerAvailableNow, ReportsSourceMetrics {
  // Row reads: the filter below works on rows, and Iceberg's vectorized reads skip nested types anyway.
  private static final Map<String, String> READ_OPTIONS = Map.of("vectorization-enabled", "false");

  private final Plan plan;
  private final SupportsRead iceberg;
  private final Rows rows;
  private int target;
  private PartitionReaderFactory icebergFactory;
  private InputPartition[] windowSplits;
  private final StructType schema;
  private ParquetFiles parquet;
  private boolean parquetChecked;
  private EpochTasks last;
  // The tasks of the epochs planned last: Spark plans a micro-batch's partitions several times.
  private final Map<Integer, EpochTasks> planned = new LinkedHashMap<>(4, 0.75f, true) {
    @Override
    protected boolean removeEldestEntry(Map.Entry<Integer, EpochTasks> eldest) {
      return size() > 4;
    }
  };

  EpochStream(Plan plan, SupportsRead iceberg, StructType schema) {
    this.plan = plan;
    this.iceberg = iceberg;
    this.rows = Rows.locate(schema, plan);
    this.schema = schema;
    this.target = plan.size();
  }

  @Override
  public Offset initialOffset() {
    return new EpochOffset(0, plan);
  }

  @Override
  public Offset latestOffset() {
    throw new UnsupportedOperationException("bergstream-backfill paces itself: latestOffset(start, limit)");
  }

  @Override
  public Offset latestOffset(Offset start, ReadLimit limit) {
    int done = epochOf(start);
    return new EpochOffset(Math.min(done + 1, Math.max(target, done)), plan);
  }

  @Override
  public ReadLimit getDefaultReadLimit() {
    return ReadLimit.maxRows(1);  // never used for rows: one epoch per micro-batch
  }

  @Override
  public Offset reportLatestOffset() {
    return new EpochOffset(plan.size(), plan);
  }

  @Override
  public void prepareForTriggerAvailableNow() {
    target = plan.size();
  }

  /** Offsets come back from the checkpoint's log as Spark's own serialized form after a restart. */
  private int epochOf(Offset offset) {
    return offset instanceof EpochOffset epoch ? epoch.epoch : EpochOffset.epochOf(offset.json(), plan);
  }

  @Override
  public Offset deserializeOffset(String json) {
    return new EpochOffset(EpochOffset.epochOf(json, plan), plan);
  }

  @Override
  public InputPartition[] planInputPartitions(Offset start, Offset end) {
    if (plan.snapshotId == null) {
      // The table had no snapshot when the backfill was planned: it has no rows for it, even if some
      // arrived since (its current snapshot is not the one the backfill pinned).
      return new InputPartition[0];
    }
    List<InputPartition> partitions = new ArrayList<>();
    for (int epoch = epochOf(start); epoch < epochOf(end); epoch++) {
      long lower = plan.epochs[epoch][0];
      long upper = plan.epochs[epoch][1];
      last = planned.computeIfAbsent(
          epoch, e -> tasks(Splits.inEpoch(icebergSplits(lower, upper), plan, lower, upper), lower, upper));
      partitions.addAll(last.partitions);
    }
    return partitions.toArray(new InputPartition[0]);
  }

  /** An epoch's tasks, and what they read: Iceberg's splits, as slices of files, of so many bytes. */
  private record EpochTasks(List<EpochPartition> partitions, int splits, int slices, long bytes) {}

  /**
   * One epoch's tasks. The splits that Spark's Parquet reader reads are packed, each file's neighbouring
   * row groups into one slice, into about one task per core of the application: a task per row group
   * would open its file and read the footer again for each. Each other split is read by Iceberg's
   * reader, a task of its own. An epoch read in strict order is one task that merges them all.
   */
  private EpochTasks tasks(InputPartition[] splits, long lower, long upper) {
    List<InputPartition> units = new ArrayList<>();
    List<ParquetFiles.Slice[]> unitSlices = new ArrayList<>();
    List<ParquetFiles.Slice> slices = new ArrayList<>();
    Map<String, Set<String>> hosts = new HashMap<>();
    long bytes = 0;
    for (InputPartition split : splits) {
      List<FileScanTask> files = Splits.fileTasks(split);
      for (FileScanTask file : files == null ? List.<FileScanTask>of() : files) {
        bytes += file.length();
      }
      ParquetFiles.Slice[] read = files == null || parquet() == null ? null : ParquetFiles.slices(files);
      if (read == null) {
        units.add(split);
        unitSlices.add(null);
        continue;
      }
      for (ParquetFiles.Slice slice : read) {
        slices.add(slice);
        hosts.computeIfAbsent(slice.path(), path -> new LinkedHashSet<>())
            .addAll(Arrays.asList(split.preferredLocations()));
      }
    }
    ParquetFiles.Reader reader = null;
    int pieces = 0;
    if (!slices.isEmpty()) {
      // The epoch's bounds go to Parquet only where a row group reaches well outside the epoch: a reader
      // with a filter is built (and its settings broadcast) for each epoch, the one without once.
      boolean wide = false;
      for (ParquetFiles.Slice slice : slices) {
        wide |= plan.widerThan(slice.path(), slice.start(), slice.length(), upper - lower);
      }
      reader = wide ? parquet().reader(lower, upper) : parquet().reader();
      int cores = plan.singleReader ? 1 : SparkSession.active().sparkContext().defaultParallelism();
      for (ParquetFiles.Slice[] group : ParquetFiles.pack(slices, cores)) {
        units.add(null);
        unitSlices.add(group);
        pieces += group.length;
      }
    }
    List<EpochPartition> tasks = new ArrayList<>();
    if (plan.singleReader) {
      if (!units.isEmpty()) {
        tasks.add(partition(units, unitSlices, reader, hosts, lower, upper, true));
      }
    } else {
      for (int i = 0; i < units.size(); i++) {
        tasks.add(partition(
            units.subList(i, i + 1), unitSlices.subList(i, i + 1), reader, hosts, lower, upper, false));
      }
    }
    return new EpochTasks(tasks, splits.length, pieces, bytes);
  }

  private static EpochPartition partition(
      List<InputPartition> units,
      List<ParquetFiles.Slice[]> slices,
      ParquetFiles.Reader reader,
      Map<String, Set<String>> fileHosts,
      long lower,
      long upper,
      boolean merged) {
    Set<String> hosts = new LinkedHashSet<>();
    for (int i = 0; i < units.size(); i++) {
      if (units.get(i) != null) {
        hosts.addAll(Arrays.asList(units.get(i).preferredLocations()));
      } else {
        for (ParquetFiles.Slice slice : slices.get(i)) {
          hosts.addAll(fileHosts.get(slice.path()));
        }
      }
    }
    return new EpochPartition(
        units.toArray(new InputPartition[0]), slices.toArray(new ParquetFiles.Slice[0][]), reader,
        hosts.toArray(new String[0]), lower, upper, merged);
  }

  /**
   * Iceberg's splits that may hold rows of [lower, upper). Where they can be looked into, the whole
   * window is planned once (manifests read, table broadcast) and each epoch takes its files' splits
   * from it; otherwise each epoch is planned as a scan of its own.
   */
  private InputPartition[] icebergSplits(long lower, long upper) {
    if (!Splits.visible()) {
      Batch batch = icebergBatch(lower, upper);
      icebergFactory = batch.createReaderFactory();
      return batch.planInputPartitions();
    }
    if (windowSplits == null) {
      Batch batch = icebergBatch(plan.windowStart, plan.windowEnd);
      icebergFactory = batch.createReaderFactory();
      windowSplits = batch.planInputPartitions();
    }
    return windowSplits;
  }

  private Batch icebergBatch(long lower, long upper) {
    if (iceberg == null) {
      throw new IllegalStateException(
          "backfill plan " + plan.path + " is for the Kafka phase alone, after the switch: the archive of "
              + plan.table + " is not read again, but the checkpoint asks for an archive epoch");
    }
    Map<String, String> options = new HashMap<>(READ_OPTIONS);
    options.putAll(plan.readOptions);
    ScanBuilder builder = iceberg.newScanBuilder(new CaseInsensitiveStringMap(options));
    if (builder instanceof SupportsPushDownV2Filters filters) {
      filters.pushPredicates(epochPredicates(lower, upper));
    }
    return builder.build().toBatch();
  }

  private Predicate[] epochPredicates(long lower, long upper) {
    NamedReference ts = Expressions.column(Rows.METADATA + "." + Rows.INGESTION_TS);
    List<Predicate> predicates = new ArrayList<>();
    predicates.add(new Predicate(">=", new Expression[] {ts, new LiteralValue<>(lower, DataTypes.TimestampType)}));
    predicates.add(new Predicate("<", new Expression[] {ts, new LiteralValue<>(upper, DataTypes.TimestampType)}));
    if (plan.regions != null) {
      List<Expression> in = new ArrayList<>();
      in.add(Expressions.column(Rows.METADATA + "." + Rows.CLUSTER));
      for (String region : plan.regions) {
        in.add(new LiteralValue<>(UTF8String.fromString(region), DataTypes.StringType));
      }
      predicates.add(new Predicate("IN", in.toArray(new Expression[0])));
    }
    return predicates.toArray(new Predicate[0]);
  }

  /** Spark's Parquet reader of the table's files, where it reads them as Iceberg would; else null. */
  private ParquetFiles parquet() {
    if (!parquetChecked && iceberg != null) {
      parquet = ParquetFiles.of(iceberg, schema, plan);
      parquetChecked = true;
    }
    return parquet;
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    if (icebergFactory == null) {  // a batch with no epoch: Iceberg's factory of any scan serves
      icebergFactory = icebergBatch(plan.windowStart, plan.windowStart + 1).createReaderFactory();
    }
    return new EpochReaderFactory(icebergFactory, schema, rows, Rows.regions(plan));
  }

  @Override
  public Map<String, String> metrics(Optional<Offset> latestConsumedOffset) {
    int epoch = latestConsumedOffset.map(this::epochOf).orElse(0);
    Map<String, String> metrics = new HashMap<>();
    metrics.put("epoch", Integer.toString(epoch));
    metrics.put("epochs", Integer.toString(plan.size()));
    metrics.put("watermark", Plan.instant(plan.watermark(epoch)));
    metrics.put("table", plan.table);
    // Which reader decodes the archive's files: Spark's vectorized Parquet reader, or Iceberg's row reader.
    metrics.put("reader", iceberg == null ? "none" : parquet() != null ? "spark-parquet" : "iceberg");
    // What the last epoch planned reads: Iceberg's splits, in so many tasks and file slices, and the
    // bytes of their row groups (before Parquet skips pages outside the epoch).
    metrics.put("splits", Integer.toString(last == null ? 0 : last.splits));
    metrics.put("tasks", Integer.toString(last == null ? 0 : last.partitions.size()));
    metrics.put("slices", Integer.toString(last == null ? 0 : last.slices));
    metrics.put("planned_bytes", Long.toString(last == null ? 0 : last.bytes));
    return metrics;
  }

  @Override
  public void commit(Offset end) {}

  @Override
  public void stop() {}

  @Override
  public String toString() {
    return "bergstream-backfill[" + plan.source + ": " + plan.table + "]";
  }
}
