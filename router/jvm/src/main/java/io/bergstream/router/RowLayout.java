package io.bergstream.router;

import java.io.Serializable;
import org.apache.spark.sql.types.StructType;

/**
 * Where the metadata a writer reads and sets is in an archive row and in a dead letter: found by name in
 * the rows' types, the names given by the one place that knows the table's layout
 * (bergstream.schemas.archive), never by position here.
 */
public final class RowLayout implements Serializable {
  private static final long serialVersionUID = 1L;
  /** The metadata struct's place in an archive row and in a dead letter, and its width. */
  final int archiveMetadata;
  final int deadLetterMetadata;
  final int metadataFields;
  /** Inside the metadata struct: the ingestion time, the partition, the offset, the write time. */
  final int ingestion;
  final int partition;
  final int offset;
  final int writeTime;

  private RowLayout(int archiveMetadata, int deadLetterMetadata, int metadataFields, int ingestion,
      int partition, int offset, int writeTime) {
    this.archiveMetadata = archiveMetadata;
    this.deadLetterMetadata = deadLetterMetadata;
    this.metadataFields = metadataFields;
    this.ingestion = ingestion;
    this.partition = partition;
    this.offset = offset;
    this.writeTime = writeTime;
  }

  /**
   * The layout of {@code archive} and {@code deadLetter} rows whose metadata struct is the field named
   * {@code metadata}, with the fields named {@code ingestion}, {@code partition}, {@code offset} and
   * {@code writeTime}; a name missing from either type is refused, naming it.
   */
  public static RowLayout of(StructType archive, StructType deadLetter, String metadata, String ingestion,
      String partition, String offset, String writeTime) {
    int archiveMetadata = index(archive, metadata, "an archive row");
    int deadLetterMetadata = index(deadLetter, metadata, "a dead letter");
    StructType fields = (StructType) archive.fields()[archiveMetadata].dataType();
    if (!fields.equals(deadLetter.fields()[deadLetterMetadata].dataType())) {
      throw new IllegalArgumentException(
          "the archive row's " + metadata + " is " + fields.simpleString() + ", the dead letter's "
              + deadLetter.fields()[deadLetterMetadata].dataType().simpleString());
    }
    return new RowLayout(archiveMetadata, deadLetterMetadata, fields.length(),
        index(fields, ingestion, metadata), index(fields, partition, metadata), index(fields, offset, metadata),
        index(fields, writeTime, metadata));
  }

  private static int index(StructType type, String name, String where) {
    for (int i = 0; i < type.length(); i++) {
      if (type.fields()[i].name().equals(name)) {
        return i;
      }
    }
    throw new IllegalArgumentException(where + " has no field " + name + ": " + type.simpleString());
  }

  /** Where the metadata struct is in a row of the archive table ({@code archive}) or of the dead letters. */
  int metadataOf(boolean archive) {
    return archive ? archiveMetadata : deadLetterMetadata;
  }
}
