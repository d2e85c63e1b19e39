package io.bergstream.schemas;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadConstraints;
import com.fasterxml.jackson.core.StreamReadFeature;
import java.io.IOException;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.types.DataTypes;

/**
 * The strict parse of a JSON value, in one pass over its bytes, beside Spark's lenient {@code from_json}
 * (the rules are schemas/parse.py's).
 *
 * <p>A value passes when it is one JSON object as RFC 8259 writes it (no NaN, no single quotes, no
 * comments, no trailing commas, no unescaped control characters), with no key twice in any object, nested
 * at most {@code maxDepth} levels, and nothing but blanks after it. It then says which of the event's
 * top-level timestamp fields, if any, holds an integer outside {@code [earliestSeconds, latestSeconds]}:
 * Spark reads a JSON number into a timestamp as epoch seconds, so that milliseconds land tens of
 * thousands of years away.
 *
 * <p>A value that decodes may still escape half of a UTF-16 surrogate pair ({@code "\\ud83d"} alone),
 * which Java would turn into "?": {@link #LONE_SURROGATE}. A literal backslash before "ud800" in a
 * string counts too; such a value goes to the dead-letter table whole, never altered.
 *
 * <p>The result is, first that applies: {@link #UNDECODABLE}, {@link #LONE_SURROGATE}, the position
 * (from 1, in the order given) of the first timestamp field out of range, {@link #VALID}; null for a
 * null value.
 */
public final class StrictJson implements UDF1<byte[], Integer> {
  private static final long serialVersionUID = 1L;

  public static final int VALID = 0;
  public static final int UNDECODABLE = -1;
  public static final int LONE_SURROGATE = -2;

  private final Map<String, Integer> timestampFields = new HashMap<>();
  private final long earliestSeconds;
  private final long latestSeconds;
  private final int maxDepth;
  private transient JsonFactory factory;

  public StrictJson(List<String> timestampFields, long earliestSeconds, long latestSeconds, int maxDepth) {
    for (int position = 0; position < timestampFields.size(); position++) {
      this.timestampFields.putIfAbsent(timestampFields.get(position), position + 1);
    }
    this.earliestSeconds = earliestSeconds;
    this.latestSeconds = latestSeconds;
    this.maxDepth = maxDepth;
  }

  /** Registers the parse in {@code spark}'s function registry as {@code name}. */
  public static void register(
      SparkSession spark,
      String name,
      List<String> timestampFields,
      long earliestSeconds,
      long latestSeconds,
      int maxDepth) {
    spark
        .udf()
        .register(
            name,
            new StrictJson(timestampFields, earliestSeconds, latestSeconds, maxDepth),
            DataTypes.IntegerType);
  }

  @Override
  public Integer call(byte[] value) {
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
    int result;
    try (JsonParser parser = factory.createParser(value)) {
      result = check(parser);
    } catch (IOException malformed) {
      return UNDECODABLE;
    }
    return result != UNDECODABLE && hasLoneSurrogate(value) ? LONE_SURROGATE : result;
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

  private int check(JsonParser parser) throws IOException {
    if (parser.nextToken() != JsonToken.START_OBJECT) {
      return UNDECODABLE;
    }
    int firstOutOfRange = Integer.MAX_VALUE;
    for (JsonToken name = parser.nextToken(); name != JsonToken.END_OBJECT; name = parser.nextToken()) {
      if (name == null) {
        return UNDECODABLE;
      }
      // A field of the outer object: its name, then its value. Nested values are read through, token by
      // token, so that they are checked too.
      Integer position = timestampFields.get(parser.currentName());
      JsonToken token = parser.nextToken();
      if (token == JsonToken.START_OBJECT || token == JsonToken.START_ARRAY) {
        parser.skipChildren();
      } else if (position != null
          && token == JsonToken.VALUE_NUMBER_INT
          && parser.getNumberType() != JsonParser.NumberType.BIG_INTEGER) {
        long seconds = parser.getLongValue();
        if (seconds < earliestSeconds || seconds > latestSeconds) {
          firstOutOfRange = Math.min(firstOutOfRange, position);
        }
      }
    }
    // Only blanks may follow the object; a second value, or anything else, is not one JSON value.
    if (parser.nextToken() != null) {
      return UNDECODABLE;
    }
    return firstOutOfRange == Integer.MAX_VALUE ? VALID : firstOutOfRange;
  }
}
