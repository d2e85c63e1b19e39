package io.bergstream.schemas;

import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.IOException;
import java.time.LocalDate;
import java.time.Month;
import java.time.Year;
import java.time.ZoneId;
import org.apache.spark.sql.catalyst.util.DateTimeUtils;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.types.UTF8String;
import scala.Option;

/**
 * A timestamp field read as Spark reads one: a string as Spark casts it (the UTC form producers send without
 * Spark's general parser), an integer as epoch seconds.
 */
final class JsonTimestamps implements JsonConverters.Converter {
  private static final long serialVersionUID = 1L;
  private final String zoneId;
  private transient ZoneId zone;

  JsonTimestamps(String zoneId) {
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
      throw new JsonConverters.NotConvertible(token, DataTypes.TimestampType);
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
      throw new JsonConverters.NotConvertible(token, DataTypes.TimestampType);
    }
    return (Long) parsed.get();
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
}
