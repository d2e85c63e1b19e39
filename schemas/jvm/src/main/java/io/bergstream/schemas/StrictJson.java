package io.bergstream.schemas;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadConstraints;
import com.fasterxml.jackson.core.StreamReadFeature;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.Serializable;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.time.LocalDate;
import java.time.Month;
import java.time.Year;
import java.time.ZoneId;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayBasedMapData;
import org.apache.spark.sql.catalyst.util.DateTimeUtils;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.catalyst.util.RebaseDateTime;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import scala.Option;

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
  private static final long serialVersionUID = 3L;
  // Writes a value that is not a string again as JSON text; thread-safe, as Jackson's factories are.
  private static final JsonFactory WRITER = new JsonFactory();
  // Eight bytes of a value at a time; the bit that only a byte outside ASCII has set, in each.
  private static final VarHandle EIGHT_BYTES =
      MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
  private static final long HIGH_BITS = 0x8080808080808080L;
  private static final long EIGHT_ONES = 0x0101010101010101L;
  private static final long EIGHT_BACKSLASHES = 0x5C5C5C5C5C5C5C5CL;
  static final int NON_ASCII = 1;
  static final int BACKSLASH = 2;

  public static final String EVENT = "event";
  public static final String STATUS = "status";
  public static final int VALID = 0;
  public static final int UNDECODABLE = -1;
  public static final int LONE_SURROGATE = -2;
  public static final int INVALID_UTF8 = -3;

  private final String name;
  private final Struct event;
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
    this.event = new Struct(eventType, zoneId);
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
    int found = scan(value);
    if ((found & NON_ASCII) != 0 && !UTF8String.fromBytes(value).isValid()) {
      return result(null, INVALID_UTF8);
    }
    if (!plainUtf8(value)) {
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
    if ((found & BACKSLASH) != 0 && hasLoneSurrogate(value)) {
      status = LONE_SURROGATE;
    }
    return result(new GenericInternalRow(fields), status);
  }

  private static InternalRow result(InternalRow event, int status) {
    return new GenericInternalRow(new Object[] {event, status});
  }

  /**
   * What one pass over a value's bytes, eight at a time, finds: {@link #NON_ASCII} if a byte is outside
   * ASCII (only then is the value's UTF-8 decoded, by Spark's {@code UTF8String.isValid}), {@link
   * #BACKSLASH} if a byte is a backslash (only then can a string escape half of a surrogate pair).
   */
  static int scan(byte[] value) {
    long bytes = 0;
    long backslashes = 0;
    int at = 0;
    for (; at + Long.BYTES <= value.length; at += Long.BYTES) {
      long word = (long) EIGHT_BYTES.get(value, at);
      bytes |= word;
      // A byte of the word is a backslash if and only if the word XOR eight backslashes has a zero byte.
      long zeroes = word ^ EIGHT_BACKSLASHES;
      backslashes |= (zeroes - EIGHT_ONES) & ~zeroes;
    }
    boolean backslash = (backslashes & HIGH_BITS) != 0;
    for (; at < value.length; at++) {
      bytes |= value[at];
      backslash |= value[at] == '\\';
    }
    return ((bytes & HIGH_BITS) != 0 ? NON_ASCII : 0) | (backslash ? BACKSLASH : 0);
  }

  /**
   * Whether Jackson reads the value as UTF-8, as Spark does: it would take a byte order mark in front
   * of the text, or a zero byte among the first four (which a JSON text never holds unescaped), for the
   * sign of another encoding, and decode UTF-16 or UTF-32 that Spark refuses.
   */
  static boolean plainUtf8(byte[] value) {
    if (value.length >= 3 && value[0] == (byte) 0xEF && value[1] == (byte) 0xBB && value[2] == (byte) 0xBF) {
      return false;
    }
    for (int at = 0; at < Math.min(4, value.length); at++) {
      if (value[at] == 0) {
        return false;
      }
    }
    return true;
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

  /** Turns the value at the parser's current token into Spark's internal value of a type. */
  private interface Converter extends Serializable {
    Object convert(JsonParser parser, JsonToken token) throws IOException;
  }

  private static final class NotConvertible extends RuntimeException {
    private static final long serialVersionUID = 1L;

    NotConvertible(JsonToken token, DataType type) {
      super(token + " is not " + type.simpleString(), null, false, false);
    }
  }

  /** A struct's fields by name, and the converter of each. */
  private static final class Struct implements Serializable {
    private static final long serialVersionUID = 1L;
    final Map<String, Integer> indexes = new HashMap<>();
    final Converter[] converters;

    Struct(StructType type, String zoneId) {
      StructField[] fields = type.fields();
      converters = new Converter[fields.length];
      for (int index = 0; index < fields.length; index++) {
        indexes.putIfAbsent(fields[index].name(), index);
        converters[index] = converter(fields[index].dataType(), zoneId);
      }
    }

    InternalRow read(JsonParser parser) throws IOException {
      Object[] values = new Object[converters.length];
      for (JsonToken name = parser.nextToken(); name != JsonToken.END_OBJECT; name = parser.nextToken()) {
        JsonToken token = parser.nextToken();
        Integer index = indexes.get(parser.currentName());
        if (index == null) {
          parser.skipChildren();
        } else {
          values[index] = converters[index].convert(parser, token);
        }
      }
      return new GenericInternalRow(values);
    }
  }

  /**
   * A value of {@code type} as Spark holds it inside a row (UTF8String, microseconds, days, internal rows,
   * arrays and maps), or null for JSON null; anything else Spark's from_json refuses throws.
   */
  private static Converter converter(DataType type, String zoneId) {
    Converter convert = nonNull(type, zoneId);
    return (parser, token) -> token == JsonToken.VALUE_NULL ? null : convert.convert(parser, token);
  }

  private static Converter nonNull(DataType type, String zoneId) {
    if (type == DataTypes.StringType) {
      return (parser, token) ->
          token == JsonToken.VALUE_STRING ? UTF8String.fromString(parser.getText()) : asText(parser);
    }
    if (type == DataTypes.IntegerType) {
      return (parser, token) -> {
        expect(token, JsonToken.VALUE_NUMBER_INT, type);
        return parser.getIntValue();
      };
    }
    if (type == DataTypes.LongType) {
      return (parser, token) -> {
        expect(token, JsonToken.VALUE_NUMBER_INT, type);
        return parser.getLongValue();
      };
    }
    if (type == DataTypes.BooleanType) {
      return (parser, token) -> {
        if (token == JsonToken.VALUE_TRUE || token == JsonToken.VALUE_FALSE) {
          return token == JsonToken.VALUE_TRUE;
        }
        throw new NotConvertible(token, type);
      };
    }
    if (type == DataTypes.DoubleType || type == DataTypes.FloatType) {
      boolean isDouble = type == DataTypes.DoubleType;
      return (parser, token) -> {
        if (token != JsonToken.VALUE_NUMBER_INT && token != JsonToken.VALUE_NUMBER_FLOAT) {
          throw new NotConvertible(token, type);
        }
        return isDouble ? (Object) parser.getDoubleValue() : (Object) parser.getFloatValue();
      };
    }
    if (type == DataTypes.BinaryType) {
      return (parser, token) -> {
        expect(token, JsonToken.VALUE_STRING, type);
        return parser.getBinaryValue();
      };
    }
    if (type == DataTypes.TimestampType) {
      return new TimestampConverter(zoneId);
    }
    if (type == DataTypes.DateType) {
      return (parser, token) -> {
        expect(token, JsonToken.VALUE_STRING, type);
        return days(parser.getText());
      };
    }
    if (type instanceof StructType struct) {
      Struct nested = new Struct(struct, zoneId);
      return (parser, token) -> {
        expect(token, JsonToken.START_OBJECT, type);
        return nested.read(parser);
      };
    }
    if (type instanceof ArrayType array) {
      Converter element = converter(array.elementType(), zoneId);
      return (parser, token) -> {
        expect(token, JsonToken.START_ARRAY, type);
        List<Object> values = new ArrayList<>();
        for (JsonToken item = parser.nextToken(); item != JsonToken.END_ARRAY; item = parser.nextToken()) {
          values.add(element.convert(parser, item));
        }
        return new GenericArrayData(values.toArray());
      };
    }
    if (type instanceof MapType map && map.keyType() == DataTypes.StringType) {
      Converter value = converter(map.valueType(), zoneId);
      return (parser, token) -> {
        expect(token, JsonToken.START_OBJECT, type);
        List<Object> keys = new ArrayList<>();
        List<Object> values = new ArrayList<>();
        for (JsonToken name = parser.nextToken(); name != JsonToken.END_OBJECT; name = parser.nextToken()) {
          keys.add(UTF8String.fromString(parser.currentName()));
          values.add(value.convert(parser, parser.nextToken()));
        }
        return new ArrayBasedMapData(new GenericArrayData(keys.toArray()), new GenericArrayData(values.toArray()));
      };
    }
    throw new IllegalArgumentException("no JSON decoding for " + type.simpleString());
  }

  private static void expect(JsonToken token, JsonToken wanted, DataType type) {
    if (token != wanted) {
      throw new NotConvertible(token, type);
    }
  }

  /** The value at the current token written again as JSON text, as from_json keeps it for a string. */
  private static UTF8String asText(JsonParser parser) throws IOException {
    ByteArrayOutputStream text = new ByteArrayOutputStream();
    try (JsonGenerator generator = WRITER.createGenerator(text)) {
      generator.copyCurrentStructure(parser);
    }
    return UTF8String.fromBytes(text.toByteArray());
  }

  /** Spark's reading of a date string: ISO-8601, then without "GMT", then days since 1970 as text. */
  private static int days(String text) {
    if (text.isEmpty()) {
      throw new IllegalArgumentException("empty date");
    }
    UTF8String utf8 = UTF8String.fromString(text);
    Option<Object> days = DateTimeUtils.stringToDate(utf8);
    if (days.isEmpty()) {
      days = DateTimeUtils.stringToDate(DateTimeUtils.cleanLegacyTimestampStr(utf8));
    }
    if (days.isDefined()) {
      return (Integer) days.get();
    }
    return RebaseDateTime.rebaseJulianToGregorianDays(Integer.parseInt(text));
  }

  /** Spark's reading of a timestamp: a string as Spark casts one, an integer as epoch seconds. */
  private static final class TimestampConverter implements Converter {
    private static final long serialVersionUID = 1L;
    private final String zoneId;
    private transient ZoneId zone;

    TimestampConverter(String zoneId) {
      this.zoneId = zoneId;
    }

    @Override
    public Object convert(JsonParser parser, JsonToken token) throws IOException {
      long micros;
      if (token == JsonToken.VALUE_NUMBER_INT) {
        micros = parser.getLongValue() * 1_000_000L;
      } else if (token == JsonToken.VALUE_STRING && parser.getTextLength() >= 1) {
        micros = utcMicros(parser.getTextCharacters(), parser.getTextOffset(), parser.getTextLength());
        if (micros == NOT_UTC) {
          micros = sparkMicros(parser, token);
        }
      } else {
        throw new NotConvertible(token, DataTypes.TimestampType);
      }
      return micros;
    }

    private long sparkMicros(JsonParser parser, JsonToken token) throws IOException {
      if (zone == null) {
        zone = ZoneId.of(zoneId);
      }
      UTF8String text = UTF8String.fromString(parser.getText());
      Option<Object> parsed = DateTimeUtils.stringToTimestamp(text, zone);
      if (parsed.isEmpty()) {
        parsed = DateTimeUtils.stringToTimestamp(DateTimeUtils.cleanLegacyTimestampStr(text), zone);
      }
      if (parsed.isEmpty()) {
        throw new NotConvertible(token, DataTypes.TimestampType);
      }
      return (Long) parsed.get();
    }
  }

  /** What {@link #utcMicros} returns for any text it does not read. */
  static final long NOT_UTC = Long.MIN_VALUE;

  /**
   * The microseconds of {@code yyyy-MM-ddTHH:mm:ssZ}, with 1 to 6 digits of a second's fraction or none,
   * a valid date and time in UTC: the form producers send, read without Spark's general parser (which
   * splits the text into segments, builds a {@code ZonedDateTime} and looks its zone up by regular
   * expressions), to the value Spark's parser gives it. {@link #NOT_UTC} for any other text, which
   * Spark's parser then reads.
   */
  static long utcMicros(char[] text, int offset, int length) {
    if (length < 20 || length == 21 || length > 27 || text[offset + length - 1] != 'Z') {
      return NOT_UTC;
    }
    if (text[offset + 4] != '-' || text[offset + 7] != '-' || text[offset + 10] != 'T'
        || text[offset + 13] != ':' || text[offset + 16] != ':'
        || (length > 20 && text[offset + 19] != '.')) {
      return NOT_UTC;
    }
    int year = digits(text, offset, 4);
    int month = digits(text, offset + 5, 2);
    int day = digits(text, offset + 8, 2);
    int hour = digits(text, offset + 11, 2);
    int minute = digits(text, offset + 14, 2);
    int second = digits(text, offset + 17, 2);
    int fractionDigits = length > 20 ? length - 21 : 0;
    int fraction = fractionDigits > 0 ? digits(text, offset + 20, fractionDigits) : 0;
    if (year < 0 || month < 1 || month > 12 || day < 1 || hour < 0 || hour > 23 || minute < 0
        || minute > 59 || second < 0 || second > 59 || fraction < 0
        || day > Month.of(month).length(Year.isLeap(year))) {
      return NOT_UTC;
    }
    for (int scale = fractionDigits; scale < 6; scale++) {
      fraction *= 10;
    }
    long seconds = LocalDate.of(year, month, day).toEpochDay() * 86_400L + hour * 3_600L + minute * 60L + second;
    return seconds * 1_000_000L + fraction;
  }

  /** The number that {@code count} ASCII digits write, or -1 if any is not a digit. */
  private static int digits(char[] text, int at, int count) {
    int number = 0;
    for (int end = at + count; at < end; at++) {
      char digit = text[at];
      if (digit < '0' || digit > '9') {
        return -1;
      }
      number = number * 10 + (digit - '0');
    }
    return number;
  }

  /**
   * An escaped high surrogate not followed by the escape of a low one, or an escaped low surrogate not
   * preceded by the escape of a high one. The escapes are ASCII, so bytes are read as characters.
   */
  static boolean hasLoneSurrogate(byte[] value) {
    for (int at = 0; at + 4 <= value.length; at++) {
      if (value[at] != '\\' || value[at + 1] != 'u' || (value[at + 2] | 0x20) != 'd') {
        continue;
      }
      if (isHigh(value, at) && !startsLow(value, at + 6)) {
        return true;
      }
      if (startsLow(value, at)
          && at + 6 <= value.length
          && isHex(value[at + 4])
          && isHex(value[at + 5])
          && !(at >= 6 && isHigh(value, at - 6))) {
        return true;
      }
    }
    return false;
  }

  /** {@code \\u} then d or D, then 8, 9, a or b (either case), then two hexadecimal digits. */
  private static boolean isHigh(byte[] value, int at) {
    if (at + 6 > value.length || value[at] != '\\' || value[at + 1] != 'u') {
      return false;
    }
    byte third = value[at + 3];
    int letter = third | 0x20;
    return (value[at + 2] | 0x20) == 'd'
        && (third == '8' || third == '9' || letter == 'a' || letter == 'b')
        && isHex(value[at + 4])
        && isHex(value[at + 5]);
  }

  /** {@code \\u} then d or D, then c to f (either case): the start of a low surrogate's escape. */
  private static boolean startsLow(byte[] value, int at) {
    if (at + 4 > value.length || value[at] != '\\' || value[at + 1] != 'u') {
      return false;
    }
    int third = value[at + 3] | 0x20;
    return (value[at + 2] | 0x20) == 'd' && third >= 'c' && third <= 'f';
  }

  private static boolean isHex(byte digit) {
    int lower = digit | 0x20;
    return (digit >= '0' && digit <= '9') || (lower >= 'a' && lower <= 'f');
  }
}
