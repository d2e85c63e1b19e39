package io.bergstream.backfill;

import java.util.EnumSet;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.metric.CustomMetric;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.execution.datasources.DataSource;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code spark.readStream.format("bergstream-hybrid").option("plan", file).options(kafkaOptions)}: one
 * source read first from its archive table, epoch by epoch as {@code bergstream-backfill} reads it, then
 * from its Kafka topic from the hand-over offsets recorded in the archive snapshot the plan pins.
 *
 * <p>The schema is Kafka's, as Spark's Kafka source gives it with headers ({@code key, value, topic,
 * partition, offset, timestamp, timestampType, headers}), and a nullable {@code __archive__} struct
 * holding the archive table's row at the pinned snapshot. An archive row has null Kafka columns and its
 * row in {@code __archive__}; a Kafka row has a null {@code __archive__}.
 *
 * <p>Once the source has switched to Kafka, its plan gives the archive row's type as the first run found
 * it ({@code archive_schema}): the table is then not loaded at all, since its snapshot, no longer held,
 * may have expired. The schema stays the same, and so does the state of the query that reads it.
 *
 * <p>Every option but {@code plan} goes to Spark's Kafka source ({@code kafka.bootstrap.servers},
 * {@code kafka.security.*}, {@code failOnDataLoss} after the switch, {@code maxOffsetsPerTrigger}, ...).
 * The source sets {@code subscribe} to the hand-over's topic, {@code includeHeaders} and
 * {@code startingOffsets} itself, and refuses options that would read from anywhere else.
 */
public final class HybridSource implements TableProvider, DataSourceRegister {
  static final String NAME = "bergstream-hybrid";
  static final String ARCHIVE_COLUMN = "__archive__";
  private static final String PLAN_OPTION = "plan";
  // Options that would choose other topics or another start than the hand-over's.
  private static final Set<String> REFUSED = Set.of(
      "assign", "subscribepattern", "startingoffsets", "startingoffsetsbytimestamp", "startingtimestamp",
      "startingoffsetsbytimestampstrategy");

  @Override
  public String shortName() {
    return NAME;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    Plan plan = plan(options);
    SupportsRead kafka = kafkaTable(kafkaOptions(options.asCaseSensitiveMap(), plan));
    StructType archived =
        plan.archiveSchema != null ? plan.archiveSchema : BackfillSource.icebergTable(plan).schema();
    return kafka.schema().add(ARCHIVE_COLUMN, archived, true);
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    Plan plan = plan(new CaseInsensitiveStringMap(properties));
    CaseInsensitiveStringMap kafkaOptions = kafkaOptions(properties, plan);
    // Null in the Kafka phase: the archive is read no more.
    SupportsRead iceberg = plan.archiveSchema != null ? null : BackfillSource.icebergTable(plan);
    return new HybridTable(plan, iceberg, kafkaTable(kafkaOptions), kafkaOptions, schema);
  }

  @Override
  public boolean supportsExternalMetadata() {
    return false;
  }

  private static Plan plan(CaseInsensitiveStringMap options) {
    Plan plan = Plan.read(options.get(PLAN_OPTION), NAME);
    if (plan.handover == null) {
      throw new IllegalArgumentException(
          "backfill plan " + plan.path + " has no 'handover': " + NAME + " reads on from Kafka where the"
              + " archive's snapshot recorded its positions");
    }
    return plan;
  }

  /** The options Spark's Kafka source gets: the user's, less `plan`, with the hand-over's topic and start. */
  static CaseInsensitiveStringMap kafkaOptions(Map<String, String> options, Plan plan) {
    Handover handover = plan.handover;
    Map<String, String> kafka = new HashMap<>();
    options.forEach((key, value) -> {
      String lower = key.toLowerCase(Locale.ROOT);
      if (lower.equals(PLAN_OPTION) || lower.equals("path")) {
        return;
      }
      if (REFUSED.contains(lower)
          || (lower.equals("subscribe") && !value.strip().equals(handover.topic))
          || (lower.equals("includeheaders") && !value.strip().equalsIgnoreCase("true"))) {
        throw new IllegalArgumentException(
            NAME + "[" + plan.source + "] reads topic " + handover.topic + " from the hand-over offsets of"
                + " plan " + plan.path + ": it sets subscribe, includeHeaders and startingOffsets itself, and"
                + " cannot take option " + key + "=" + value);
      }
      if (!lower.equals("subscribe") && !lower.equals("includeheaders")) {
        kafka.put(key, value);
      }
    });
    kafka.put("subscribe", handover.topic);
    kafka.put("includeHeaders", "true");
    // Never resolved (Kafka's stream is not asked for an initial offset), but if it were: the same start.
    kafka.put("startingOffsets", handover.startingOffsets());
    return new CaseInsensitiveStringMap(kafka);
  }

  /** Spark's Kafka table, found as format("kafka") finds it: Spark's Kafka source is not linked here. */
  static SupportsRead kafkaTable(CaseInsensitiveStringMap kafkaOptions) {
    Object provider;
    try {
      Class<?> type = DataSource.lookupDataSource("kafka", SQLConf.get());
      provider = type.getDeclaredConstructor().newInstance();
    } catch (ReflectiveOperationException | RuntimeException e) {
      throw new IllegalStateException(
          NAME + " reads Kafka with Spark's Kafka source, which is not on the classpath"
              + " (spark-sql-kafka-0-10): " + e.getMessage(), e);
    }
    if (!(provider instanceof TableProvider kafka)) {
      throw new IllegalStateException(
          "Spark's Kafka source " + provider.getClass().getName() + " has no tables");
    }
    Table table = kafka.getTable(kafka.inferSchema(kafkaOptions), new Transform[0], kafkaOptions);
    if (!(table instanceof SupportsRead readable)) {
      throw new IllegalStateException("Spark's Kafka table " + table.name() + " cannot be read");
    }
    return readable;
  }

  /** The archive table, then the topic. */
  static final class HybridTable implements SupportsRead {
    private final Plan plan;
    private final SupportsRead iceberg;
    private final SupportsRead kafka;
    private final CaseInsensitiveStringMap kafkaOptions;
    private final StructType schema;

    HybridTable(
        Plan plan,
        SupportsRead iceberg,
        SupportsRead kafka,
        CaseInsensitiveStringMap kafkaOptions,
        StructType schema) {
      this.plan = plan;
      this.iceberg = iceberg;
      this.kafka = kafka;
      this.kafkaOptions = kafkaOptions;
      this.schema = schema;
    }

    @Override
    public String name() {
      return NAME + "[" + plan.source + ": " + plan.table + " then Kafka " + plan.handover.topic + "]";
    }

    @Override
    public StructType schema() {
      return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.MICRO_BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      Scan kafkaScan = kafka.newScanBuilder(kafkaOptions).build();
      Map<String, String> strict = new HashMap<>(kafkaOptions.asCaseSensitiveMap());
      strict.keySet().removeIf(key -> key.equalsIgnoreCase("failOnDataLoss"));
      strict.put("failOnDataLoss", "true");
      Scan switchScan = kafka.newScanBuilder(new CaseInsensitiveStringMap(strict)).build();
      StructType archiveType = (StructType) schema.apply(ARCHIVE_COLUMN).dataType();
      int kafkaColumns = schema.fields().length - 1;
      return () -> new Scan() {
        @Override
        public StructType readSchema() {
          return schema;
        }

        @Override
        public String description() {
          return name();
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
          // Kafka's stream gets a folder of its own beside this source's: it is never asked to write there.
          return new HybridStream(
              plan,
              new EpochStream(plan, iceberg, archiveType),
              kafkaScan.toMicroBatchStream(checkpointLocation + "/kafka"),
              switchScan.toMicroBatchStream(checkpointLocation + "/kafka"),
              kafkaOptions.asCaseSensitiveMap(),
              kafkaColumns);
        }

        @Override
        public CustomMetric[] supportedCustomMetrics() {
          return kafkaScan.supportedCustomMetrics();  // offsetOutOfRange, dataLoss of Kafka's readers
        }

        @Override
        public ColumnarSupportMode columnarSupportMode() {
          return ColumnarSupportMode.UNSUPPORTED;
        }
      };
    }
  }
}
