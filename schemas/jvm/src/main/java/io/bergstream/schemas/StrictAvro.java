package io.bergstream.schemas;

import java.io.Serializable;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.avro.AvroDeserializer;
import org.apache.spark.sql.avro.SchemaConverters;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import scala.Option;

/**
 * A topic's Avro value decoded into its event, with the writer's schema resolved to the reader's, and
 * known to end where the record does (the rules are bergstream.schemas.parse's).
 *
 * <p>Decoding is Avro's {@code GenericDatumReader} over the value's bytes and Spark's own {@code
 * AvroDeserializer} into Spark's internal row, as {@code from_avro} does; then the decoder's position
 * says whether bytes follow the record (another schema's record that decodes as far as it goes, garbage
 * after a valid one). The result is a struct of the event and a status: {@link #VALID}; {@link
 * #UNDECODABLE} (the event null) for a value that does not decode, or whose values Spark cannot hold (a
 * timestamp past the year 294,247); {@link #LEFT_OVER} (the event null) for bytes after the record. A
 * null value gives null.
 */
public final class StrictAvro implements Serializable {
  private static final long serialVersionUID = 1L;
  public static final String EVENT = "event";
  public static final String STATUS = "status";
  public static final int VALID = 0;
  public static final int UNDECODABLE = -1;
  public static final int LEFT_OVER = -4;

  private final String name;
  private final String writerJson;
  private final String readerJson;
  private transient GenericDatumReader<Object> reader;
  private transient AvroDeserializer deserializer;
  private transient BinaryDecoder decoder;
  private transient Object reused;

  private StrictAvro(String name, String writerJson, String readerJson) {
    this.name = name;
    this.writerJson = writerJson;
    this.readerJson = readerJson;
  }

  /** Spark's type of the reader's schema's records, as {@code from_avro} gives it. */
  public static StructType eventType(String readerJson) {
    Schema schema = new Schema.Parser().parse(readerJson);
    DataType type = SchemaConverters.toSqlType(schema, false, "member_", -1).dataType();
    if (!(type instanceof StructType struct)) {
      throw new IllegalArgumentException("the Avro schema " + schema.getFullName() + " is not a record");
    }
    return struct;
  }

  /**
   * The decoding of {@code value} (a binary column) written with the schema {@code writerJson}, read
   * as {@code readerJson} (Avro schemas as JSON text), as a column of a struct of the event and the
   * status; dates and timestamps are read as {@code spark.sql.avro.datetimeRebaseModeInRead} says, as
   * {@code from_avro} reads them. The decoder is an expression of Spark's own, called from the
   * projection's generated code; {@code name} is how plans show it.
   */
  public static Column column(Column value, String name, String writerJson, String readerJson) {
    StrictAvro decoder = new StrictAvro(name, writerJson, readerJson);
    StructType result =
        new StructType()
            .add(EVENT, eventType(readerJson), true)
            .add(STATUS, DataTypes.IntegerType, true);
    return Decoding.column(decoder, result, value);
  }

  @Override
  public String toString() {
    return name;
  }

  /** The event and status of one value as Spark's internal row; null for null. */
  public InternalRow decode(byte[] value) {
    if (value == null) {
      return null;
    }
    if (reader == null) {
      Schema writer = new Schema.Parser().parse(writerJson);
      Schema read = readerJson.equals(writerJson) ? writer : new Schema.Parser().parse(readerJson);
      reader = new GenericDatumReader<>(writer, read);
      String rebaseMode = SQLConf.get().getConf(SQLConf.AVRO_REBASE_MODE_IN_READ()).toString();
      deserializer = new AvroDeserializer(read, eventType(readerJson), rebaseMode, false, "member_", -1);
    }
    Option<Object> event;
    try {
      decoder = DecoderFactory.get().binaryDecoder(value, 0, value.length, decoder);
      reused = reader.read(reused, decoder);
      if (!decoder.isEnd()) {
        return result(null, LEFT_OVER);
      }
      event = deserializer.deserialize(reused);
    } catch (Exception undecodable) {
      // What Avro's decoder finds in the bytes (a negative length, a long beyond 64 bits, a length
      // beyond the value), or a value Spark cannot hold: from_avro's PERMISSIVE mode gives null too.
      reused = null;
      return result(null, UNDECODABLE);
    }
    return event.isDefined() ? result((InternalRow) event.get(), VALID) : result(null, UNDECODABLE);
  }

  private static InternalRow result(InternalRow event, int status) {
    return new GenericInternalRow(new Object[] {event, status});
  }
}
