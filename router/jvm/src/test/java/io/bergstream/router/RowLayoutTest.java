package io.bergstream.router;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.junit.jupiter.api.Test;

/** The metadata's place in a topic's rows, found by the names the layout gives, never by position. */
class RowLayoutTest {
  static final StructType METADATA =
      new StructType()
          .add("kafka_ingestion_ts", DataTypes.TimestampType)
          .add("topic", DataTypes.StringType)
          .add("partition", DataTypes.IntegerType)
          .add("offset", DataTypes.LongType)
          .add("router_write_ts", DataTypes.TimestampType);
  static final StructType ARCHIVE =
      new StructType().add("title", DataTypes.StringType).add("__metadata__", METADATA);
  static final StructType DEAD_LETTER =
      new StructType()
          .add("raw_value", DataTypes.BinaryType)
          .add("error", DataTypes.StringType)
          .add("__metadata__", METADATA)
          .add("redriven_at", DataTypes.TimestampType);

  static RowLayout layout(StructType archive, StructType deadLetter) {
    return RowLayout.of(archive, deadLetter, "__metadata__", "kafka_ingestion_ts", "partition", "offset",
        "router_write_ts");
  }

  @Test
  void positionsAreFoundByName() {
    RowLayout layout = layout(ARCHIVE, DEAD_LETTER);
    assertEquals(1, layout.archiveMetadata);
    assertEquals(2, layout.deadLetterMetadata);
    assertEquals(5, layout.metadataFields);
    assertEquals(0, layout.ingestion);
    assertEquals(2, layout.partition);
    assertEquals(3, layout.offset);
    assertEquals(4, layout.writeTime);
    // Another order of the same fields: other positions, the same layout by name.
    StructType moved = new StructType().add("__metadata__", METADATA).add("title", DataTypes.StringType);
    assertEquals(0, layout(moved, DEAD_LETTER).archiveMetadata);
  }

  @Test
  void aMissingFieldOrTwoMetadataTypesAreRefusedNamingThem() {
    StructType without = new StructType().add("title", DataTypes.StringType);
    IllegalArgumentException missing =
        assertThrows(IllegalArgumentException.class, () -> layout(without, DEAD_LETTER));
    assertTrue(missing.getMessage().startsWith("an archive row has no field __metadata__"), missing.getMessage());
    StructType other = new StructType().add("__metadata__", new StructType().add("offset", DataTypes.LongType));
    IllegalArgumentException differ =
        assertThrows(IllegalArgumentException.class, () -> layout(ARCHIVE, other));
    assertTrue(differ.getMessage().startsWith("the archive row's __metadata__ is"), differ.getMessage());
  }
}
