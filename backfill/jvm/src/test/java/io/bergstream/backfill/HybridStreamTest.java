package io.bergstream.backfill;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
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
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.junit.jupiter.api.Test;

/**
 * The hybrid stream's decisions that need neither Spark nor Kafka: when the hand-over is checked, when
 * the archive phase ends, what is refused, and what Kafka's stream is asked in the Kafka phase. The
 * Kafka options name no broker, so a check of the hand-over stops before any Kafka client is made: the
 * tests see that it was made, and where, by its refusal.
 */
class HybridStreamTest {
  private static final Map<String, String> NO_BROKER = Map.of("kafka.isolation.level", "read_committed");
  private static final StructType ARCHIVE = new StructType()
      .add("value", DataTypes.BinaryType)
      .add(Rows.METADATA, new StructType()
          .add(Rows.INGESTION_TS, DataTypes.TimestampType)
          .add(Rows.CLUSTER, DataTypes.StringType));

  private static Offset text(String json) {
    return new Offset() {
      @Override
      public String json() {
        return json;
      }
    };
  }

  /**
   * Spark's Kafka stream as the hybrid stream sees it, through Spark's interfaces alone: offsets are their
   * text, its latest offset is what the test sets, and it notes what it is asked. Planning and reading
   * Kafka's ranges is never reached here.
   */
  private static final class KafkaStream
      implements MicroBatchStream, SupportsAdmissionControl, SupportsTriggerAvailableNow, ReportsSourceMetrics {
    static final ReadLimit OWN_LIMIT = ReadLimit.maxRows(500);
    Offset latest;
    final List<String> askedFrom = new ArrayList<>();
    final List<ReadLimit> askedWith = new ArrayList<>();
    final List<String> committed = new ArrayList<>();
    int prepared;
    int preparedWhenAsked = -1;

    @Override
    public Offset deserializeOffset(String json) {
      return text(json);
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
      return OWN_LIMIT;
    }

    @Override
    public Offset latestOffset(Offset start, ReadLimit limit) {
      askedFrom.add(start.json());
      askedWith.add(limit);
      if (preparedWhenAsked < 0) {
        preparedWhenAsked = prepared;
      }
      return latest;
    }

    /** As Spark's Kafka stream, which fails until it has fetched its latest offset (SPARK-55271). */
    @Override
    public Offset reportLatestOffset() {
      if (askedFrom.isEmpty()) {
        throw new IllegalStateException("Kafka's latest offset was not fetched");
      }
      return latest;
    }

    @Override
    public void prepareForTriggerAvailableNow() {
      prepared++;
    }

    @Override
    public Map<String, String> metrics(Optional<Offset> latestConsumedOffset) {
      return Map.of("avgOffsetsBehindLatest", "0.0");
    }

    @Override
    public void commit(Offset end) {
      committed.add(end == null ? null : end.json());
    }

    @Override
    public void stop() {}

    @Override
    public Offset latestOffset() {
      throw new UnsupportedOperationException("not Spark's call for a stream with admission control");
    }

    @Override
    public Offset initialOffset() {
      throw new UnsupportedOperationException("the hybrid stream starts Kafka from the hand-over");
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
      throw new UnsupportedOperationException("planning Kafka's ranges needs Kafka");
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      throw new UnsupportedOperationException("reading Kafka needs Kafka");
    }
  }

  private final Plan plan = Plans.hybrid(4);
  private final KafkaStream kafka = new KafkaStream();
  private final KafkaStream switchKafka = new KafkaStream();
  private final HybridStream stream =
      new HybridStream(plan, new EpochStream(plan, null, ARCHIVE), kafka, switchKafka, NO_BROKER, 8);

  private HybridOffset inKafka(String partitions) {
    return HybridOffset.kafka(text("{\"playback\":" + partitions + "}"), plan);
  }

  @Test
  void theFirstArchiveMicroBatchChecksTheHandoverAtStart() {
    IllegalArgumentException refused = assertThrows(
        IllegalArgumentException.class, () -> stream.latestOffset(stream.initialOffset(), ReadLimit.allAvailable()));
    assertTrue(refused.getMessage().startsWith("playback: at start: "), refused.getMessage());
    assertTrue(kafka.askedFrom.isEmpty());
  }

  @Test
  void theLastEpochIsStillTheArchivesAndAfterItTheSwitchChecksTheHandover() {
    IllegalArgumentException last = assertThrows(IllegalArgumentException.class,
        () -> stream.latestOffset(HybridOffset.archive(3, plan), ReadLimit.allAvailable()));
    assertTrue(last.getMessage().startsWith("playback: at start: "), last.getMessage());
    IllegalArgumentException atSwitch = assertThrows(IllegalArgumentException.class,
        () -> stream.latestOffset(text(HybridOffset.archive(4, plan).json()), ReadLimit.allAvailable()));
    assertTrue(atSwitch.getMessage().startsWith("playback: at the switch: "), atSwitch.getMessage());
    assertTrue(kafka.askedFrom.isEmpty());
  }

  @Test
  void theSwitchMicroBatchIsPlannedOnlyAfterACheckOfTheHandover() {
    // As Spark replays it after a restart: both offsets read back from the offset log.
    Offset start = text(HybridOffset.archive(4, plan).json());
    Offset end = text(inKafka("{\"0\":1300,\"1\":990}").json());
    IllegalArgumentException refused =
        assertThrows(IllegalArgumentException.class, () -> stream.planInputPartitions(start, end));
    assertTrue(refused.getMessage().startsWith("playback: reading the switch micro-batch: "), refused.getMessage());
  }

  @Test
  void aMicroBatchFromKafkaBackToTheArchiveIsRefused() {
    HybridOffset start = inKafka("{\"0\":1300,\"1\":990}");
    IllegalStateException refused = assertThrows(
        IllegalStateException.class, () -> stream.planInputPartitions(start, HybridOffset.archive(2, plan)));
    assertTrue(refused.getMessage().contains("back to the archive"), refused.getMessage());
  }

  @Test
  void inTheKafkaPhaseKafkaIsAskedFromWhereItIsWithItsOwnLimitAndNoCheck() {
    kafka.latest = text("{\"playback\":{\"0\":1400,\"1\":990}}");
    Offset next = stream.latestOffset(inKafka("{\"0\":1300,\"1\":990}"), ReadLimit.maxRows(1));
    assertEquals(inKafka("{\"0\":1400,\"1\":990}").json(), next.json());
    assertEquals(List.of("{\"playback\":{\"0\":1300,\"1\":990}}"), kafka.askedFrom);
    assertEquals(List.of(KafkaStream.OWN_LIMIT), kafka.askedWith);
    kafka.latest = null;  // Kafka has nothing new: the micro-batch ends where it starts
    assertEquals(next.json(), stream.latestOffset(next, ReadLimit.allAvailable()).json());
    assertTrue(switchKafka.askedFrom.isEmpty());
  }

  @Test
  void withAvailableNowKafkaIsPreparedOnceJustBeforeItIsFirstAsked() {
    stream.prepareForTriggerAvailableNow();
    assertEquals(0, kafka.prepared);
    kafka.latest = text("{\"playback\":{\"0\":1400,\"1\":990}}");
    Offset next = stream.latestOffset(inKafka("{\"0\":1300,\"1\":990}"), ReadLimit.allAvailable());
    stream.latestOffset(next, ReadLimit.allAvailable());
    assertEquals(1, kafka.prepared);
    assertEquals(1, kafka.preparedWhenAsked);
  }

  @Test
  void beforeAnyOffsetTheProgressShowsTheArchivesStartAndItsEndAsLatest() {
    Map<String, String> metrics = stream.metrics(Optional.empty());
    assertEquals(HybridOffset.ARCHIVE, metrics.get("phase"));
    assertEquals("0", metrics.get("epoch"));
    assertEquals("4", metrics.get("epochs"));
    assertEquals("2026-11-22T00:00:00Z", metrics.get("watermark"));
    assertEquals("7", metrics.get("snapshot"));
    assertEquals("{\"playback\":{\"0\":1234,\"1\":987}}", metrics.get("handover"));
    assertEquals(HybridOffset.archive(4, plan).json(), stream.reportLatestOffset().json());
    assertTrue(stream.toString().endsWith(": archive epoch 0/4 of cat.archive.playback]"), stream.toString());
  }

  @Test
  void afterARestartInTheKafkaPhaseKafkasLatestAndMetricsWaitForItsFirstFetch() {
    String consumedText = inKafka("{\"0\":1300,\"1\":990}").json();
    Offset consumed = stream.deserializeOffset(consumedText);
    kafka.latest = text("{\"playback\":{\"0\":1400,\"1\":990}}");
    assertNull(stream.reportLatestOffset());
    Map<String, String> replayed = stream.metrics(Optional.of(consumed));
    assertEquals(HybridOffset.KAFKA, replayed.get("phase"));
    assertEquals("4", replayed.get("epoch"));
    assertFalse(replayed.containsKey("avgOffsetsBehindLatest"), replayed.toString());
    assertTrue(stream.toString().endsWith(": kafka playback from hand-over (snapshot 7)]"), stream.toString());

    stream.latestOffset(consumed, ReadLimit.allAvailable());
    assertEquals(inKafka("{\"0\":1400,\"1\":990}").json(), stream.reportLatestOffset().json());
    assertEquals("0.0", stream.metrics(Optional.of(consumed)).get("avgOffsetsBehindLatest"));
  }

  @Test
  void aCommitInTheArchiveIsNotKafkasAndOneInKafkaIs() {
    stream.commit(HybridOffset.archive(2, plan));
    assertTrue(kafka.committed.isEmpty());
    stream.commit(text(inKafka("{\"0\":1300,\"1\":990}").json()));
    assertEquals(List.of("{\"playback\":{\"0\":1300,\"1\":990}}"), kafka.committed);
  }
}
