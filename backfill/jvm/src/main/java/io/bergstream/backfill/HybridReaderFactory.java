package io.bergstream.backfill;

import java.io.IOException;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.JoinedRow;
import org.apache.spark.sql.connector.metric.CustomTaskMetric;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;

/**
 * Rows of the {@code bergstream-hybrid} schema: Kafka's columns, then {@code __archive__}. A Kafka row is
 * Kafka's own row followed by a null archive; an archive row is null Kafka columns followed by the
 * archive table's row. Rows are handed on as the readers make them (reused): Spark's scan copies each
 * into an unsafe row at once.
 */
final class HybridReaderFactory implements PartitionReaderFactory {
  private static final long serialVersionUID = 1L;

  // Null when the micro-batch reads no epoch of the archive.
  private final PartitionReaderFactory archive;
  // Null when the micro-batch reads nothing from Kafka.
  private final PartitionReaderFactory kafka;
  private final int kafkaColumns;

  HybridReaderFactory(PartitionReaderFactory archive, PartitionReaderFactory kafka, int kafkaColumns) {
    this.archive = archive;
    this.kafka = kafka;
    this.kafkaColumns = kafkaColumns;
  }

  @Override
  public PartitionReader<InternalRow> createReader(InputPartition partition) {
    HybridPartition hybrid = (HybridPartition) partition;
    PartitionReaderFactory factory = hybrid.fromKafka ? kafka : archive;
    if (factory == null) {
      throw new IllegalStateException("no reader for " + (hybrid.fromKafka ? "Kafka" : "the archive")
          + " in a micro-batch planned without it");
    }
    PartitionReader<InternalRow> reader = factory.createReader(hybrid.inner);
    return hybrid.fromKafka ? new KafkaRows(reader) : new ArchiveRows(reader, kafkaColumns);
  }

  @Override
  public boolean supportColumnarReads(InputPartition partition) {
    return false;
  }

  /** The reader's rows in one slot of a wider row; Kafka's and the archive's readers are told apart. */
  private abstract static class Wrapped implements PartitionReader<InternalRow> {
    final PartitionReader<InternalRow> reader;

    Wrapped(PartitionReader<InternalRow> reader) {
      this.reader = reader;
    }

    @Override
    public boolean next() throws IOException {
      return reader.next();
    }

    @Override
    public CustomTaskMetric[] currentMetricsValues() {
      return reader.currentMetricsValues();
    }

    @Override
    public void close() throws IOException {
      reader.close();
    }
  }

  private static final class KafkaRows extends Wrapped {
    private final InternalRow noArchive = new GenericInternalRow(1);
    private final JoinedRow row = new JoinedRow();

    KafkaRows(PartitionReader<InternalRow> reader) {
      super(reader);
    }

    @Override
    public InternalRow get() {
      return row.apply(reader.get(), noArchive);
    }
  }

  private static final class ArchiveRows extends Wrapped {
    private final GenericInternalRow row;
    private final int slot;

    ArchiveRows(PartitionReader<InternalRow> reader, int kafkaColumns) {
      super(reader);
      this.row = new GenericInternalRow(kafkaColumns + 1);
      this.slot = kafkaColumns;
    }

    @Override
    public InternalRow get() {
      row.update(slot, reader.get());
      return row;
    }
  }
}
