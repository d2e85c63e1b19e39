package io.bergstream.schemas;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadConstraints;
import com.fasterxml.jackson.core.StreamReadFeature;
import java.io.IOException;
import java.io.Serializable;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A topic's JSON value decoded into its event in one strict pass of Jackson over the value's bytes (the
 * rules are bergstream.schemas.parse's).
 *
 * <p>A value decodes when it is one JSON object as RFC 8259 writes it (no NaN, no single quotes, no
 * comments, no trailing commas, no unescaped control characters), with no key twice in any object, nested
 * at most {@code maxDepth} levels, nothing but blanks after it, and every field of the event convertible
 * to its type. Conversions are those of Spark's {@code from_json}, so that the archive holds what a Spark
 * job reading the topic would: a number, a boolean, an object or an array sent for a string field is
 * kept as its JSON text (as Jackson writes it again); a JSON integer for a timestamp is epoch seconds; a
 * timestamp or date string is read by Spark's own parser; fields the event does not have are skipped.
 *
 * <p>The result is a struct of the event and a status, first that applies: {@link #INVALID_UTF8} (the
 * event null) for a value that is not valid UTF-8 as Spark's {@code is_valid_utf8} judges it, {@link
 * #UNDECODABLE} (the event null), {@link #LONE_SURROGATE} for a value that escapes half of a UTF-16 surrogate pair ({@code
 * "\\ud83d"} alone, which Java would turn into "?"; a literal backslash before "ud800" in a string counts
 * too, so that such a value goes to the dead-letter table whole, never altered), the position (from 1,
 * in the order given) of the first top-level timestamp field sent as an integer outside {@code
 * [earliestSeconds, latestSeconds]} (Spark reads it as epoch seconds, unchecked: milliseconds land tens
 * of thousands of years away), {@link #VALID}. A null value gives null.
 */
public final class StrictJson implements Serializable {
  private static final long serialVersionUID = 4L;

  public static final String EVENT = "event";
  public static final String STATUS = "status";
  public static final int VALID = 0;
  public static final int UNDECODABLE = -1;
  public static final int LONE_SURROGATE = -2;
  public static final int INVALID_UTF8 = -3;

  private final String name;
  private final JsonConverters.Struct event;
  private final Map<String, Integer> timestampFields = new HashMap<>();
  private final long earliestSeconds;
  private final long latestSeconds;
  private final int maxDepth;
  private transient JsonFactory factory;

  public StrictJson(
      String name,
      StructType eventType,
      List<String> timestampFields,
      long earliestSeconds,
      long latestSeconds,
      int maxDepth,
      String zoneId) {
    this.name = name;
    this.event = new JsonConverters.Struct(eventType, zoneId);
    for (int position = 0; position < timestampFields.size(); position++) {
      this.timestampFields.putIfAbsent(timestampFields.get(position), position + 1);
    }
    this.earliestSeconds = earliestSeconds;
    this.latestSeconds = latestSeconds;
    this.maxDepth = maxDepth;
  }

  /** The struct the decoder returns: the event, then the status. */
  public static StructType resultType(StructType eventType) {
    return new StructType()
        .add(EVENT, eventType, true)
        .add(STATUS, DataTypes.IntegerType, true);
  }

  /**
   * The decoding of {@code value} (a binary column) by the decoder of {@code eventTypeJson} (a Spark
   * struct type as JSON), as a column of {@link #resultType}; timestamps without a zone are read in
   * {@code spark}'s session time zone. The decoder is an expression of Spark's own that calls {@link
   * #decode} from the generated code of the projection, and builds Spark's internal row itself: no
   * conversion of an external {@code Row} per record, as a user-defined function's result needs. {@code
   * name} is how plans show it.
   */
  public static Column column(
      SparkSession spark,
      Column value,
      String name,
      String eventTypeJson,
      List<String> timestampFields,
      long earliestSeconds,
      long latestSeconds,
      int maxDepth) {
    StructType eventType = (StructType) DataType.fromJson(eventTypeJson);
    String zoneId = spark.conf().get("spark.sql.session.timeZone");
    StrictJson decoder =
        new StrictJson(name, eventType, timestampFields, earliestSeconds, latestSeconds, maxDepth, zoneId);
    return Decoding.column(decoder, resultType(eventType), value);
  }

  @Override
  public String toString() {
    return name;
  }

  /** The struct of {@link #resultType} for one value, as Spark's internal row; null for null. */
  public InternalRow decode(byte[] value) {
    if (value == null) {
      return null;
    }
    if (factory == null) {
      factory =
          JsonFactory.builder()
              .enable(StreamReadFeature.STRICT_DUPLICATE_DETECTION)
              .streamReadConstraints(StreamReadConstraints.builder().maxNestingDepth(maxDepth).build())
              .build();
    }
    int found = JsonBytes.scan(value);
    if ((found & JsonBytes.NON_ASCII) != 0 && !UTF8String.fromBytes(value).isValid()) {
      return result(null, INVALID_UTF8);
    }
    if (!JsonBytes.plainUtf8(value)) {
      return result(null, UNDECODABLE);
    }
    Object[] fields = new Object[event.converters.length];
    int status;
    try (JsonParser parser = factory.createParser(value)) {
      status = decode(parser, fields);
    } catch (IOException | RuntimeException undecodable) {
      // Malformed JSON, or a field that does not convert to its type: Spark's from_json would mark the
      // record corrupt.
      status = UNDECODABLE;
    }
    if (status == UNDECODABLE) {
      return result(null, UNDECODABLE);
    }
    if ((found & JsonBytes.BACKSLASH) != 0 && JsonBytes.hasLoneSurrogate(value)) {
      status = LONE_SURROGATE;
    }
    return result(new GenericInternalRow(fields), status);
  }

  private static InternalRow result(InternalRow event, int status) {
    return new GenericInternalRow(new Object[] {event, status});
  }

  private int decode(JsonParser parser, Object[] fields) throws IOException {
    if (parser.nextToken() != JsonToken.START_OBJECT) {
      return UNDECODABLE;
    }
    int firstOutOfRange = Integer.MAX_VALUE;
    for (JsonToken name = parser.nextToken(); name != JsonToken.END_OBJECT; name = parser.nextToken()) {
      if (name == null) {
        return UNDECODABLE;
      }
      String fieldName = parser.currentName();
      JsonToken token = parser.nextToken();
      Integer index = event.indexes.get(fieldName);
      if (index == null) {
        // Not a field of the event: read through, token by token, so that it is checked too.
        parser.skipChildren();
        continue;
      }
      Integer position = timestampFields.get(fieldName);
      if (position != null
          && token == JsonToken.VALUE_NUMBER_INT
          && parser.getNumberType() != JsonParser.NumberType.BIG_INTEGER) {
        long seconds = parser.getLongValue();
        if (seconds < earliestSeconds || seconds > latestSeconds) {
          firstOutOfRange = Math.min(firstOutOfRange, position);
        }
      }
      fields[index] = event.converters[index].convert(parser, token);
    }
    // Only blanks may follow the object; a second value, or anything else, is not one JSON value.
    if (parser.nextToken() != null) {
      return UNDECODABLE;
    }
    return firstOutOfRange == Integer.MAX_VALUE ? VALID : firstOutOfRange;
  }
}
