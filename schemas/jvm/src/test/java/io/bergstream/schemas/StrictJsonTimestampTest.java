package io.bergstream.schemas;

import static io.bergstream.schemas.Decoders.decoder;
import static io.bergstream.schemas.Decoders.status;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Instant;
import java.time.LocalDateTime;
import java.time.ZoneId;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.DateTimeUtils;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.junit.jupiter.api.Test;
import scala.Option;

/**
 * Timestamps as the strict JSON decoder reads them: text as Spark casts it (a zone-less one in the session's
 * zone), an integer as epoch seconds, and the position of the first top-level one sent as a number outside
 * 2000 to 2200.
 */
class StrictJsonTimestampTest {
  private static final List<String> ZONES = List.of("UTC", "America/Los_Angeles", "Asia/Kolkata", "Pacific/Chatham");
  private static final StructType EVENT =
      new StructType()
          .add("a", DataTypes.TimestampType)
          .add("b", DataTypes.TimestampType)
          .add("n", new StructType().add("t", DataTypes.TimestampType))
          .add("c", DataTypes.TimestampType);
  private static final List<String> TIMESTAMPS = List.of("a", "b", "c");

  private static long micros(Instant instant) {
    return Math.addExact(Math.multiplyExact(instant.getEpochSecond(), 1_000_000L), instant.getNano() / 1_000);
  }

  private static long micros(String iso) {
    return micros(Instant.parse(iso));
  }

  /** The decoded field {@code x} of {@code {"x": json}}, a timestamp, in a session of {@code zone}. */
  private static Object at(String json, String zone) {
    StructType event = new StructType().add("x", DataTypes.TimestampType);
    InternalRow decoded = Decoders.decoded(decoder(event, List.of(), zone), "{\"x\": " + json + "}");
    InternalRow fields = decoded.getStruct(0, 1);
    return fields == null ? "undecodable" : fields.get(0, DataTypes.TimestampType);
  }

  private static Object at(String json) {
    return at(json, "UTC");
  }

  /** What Spark's cast of the text to a timestamp gives, as from_json reads it; "undecodable" for none. */
  private static Object spark(String text, String zone) {
    UTF8String utf8 = UTF8String.fromString(text);
    Option<Object> parsed = DateTimeUtils.stringToTimestamp(utf8, ZoneId.of(zone));
    if (parsed.isEmpty()) {
      parsed = DateTimeUtils.stringToTimestamp(DateTimeUtils.cleanLegacyTimestampStr(utf8), ZoneId.of(zone));
    }
    return parsed.isEmpty() || text.isEmpty() ? "undecodable" : parsed.get();
  }

  @Test
  void isoTextInUtcIsThatInstantInEverySessionZone() {
    for (String zone : ZONES) {
      assertEquals(micros("2026-11-22T05:06:07Z"), at("\"2026-11-22T05:06:07Z\"", zone), zone);
      assertEquals(micros("2024-02-29T23:59:59.999999Z"), at("\"2024-02-29T23:59:59.999999Z\"", zone), zone);
    }
  }

  @Test
  void fractionsOfASecondAreKeptToTheMicrosecond() {
    assertEquals(micros("2026-11-22T05:06:07.500Z"), at("\"2026-11-22T05:06:07.5Z\""));
    assertEquals(micros("2026-11-22T05:06:07.050Z"), at("\"2026-11-22T05:06:07.05Z\""));
    assertEquals(micros("2026-11-22T05:06:07.123456Z"), at("\"2026-11-22T05:06:07.123456Z\""));
    assertEquals(micros("2026-11-22T05:06:07.000001Z"), at("\"2026-11-22T05:06:07.000001Z\""));
    // Digits beyond the microsecond are dropped.
    assertEquals(micros("2026-11-22T05:06:07.123456Z"), at("\"2026-11-22T05:06:07.1234567Z\""));
    assertEquals(-500_000L, at("\"1969-12-31T23:59:59.5Z\""));
  }

  @Test
  void isoTextWithAnOffsetOrZoneIsThatInstant() {
    long instant = micros("2026-11-22T03:06:07.123456Z");
    for (String zone : ZONES) {
      assertEquals(instant, at("\"2026-11-22 05:06:07.123456789+02:00\"", zone), zone);
      assertEquals(instant, at("\"2026-11-22T00:36:07.123456-02:30\"", zone), zone);
      assertEquals(micros("2026-11-22T00:00:00Z"), at("\"2026-11-22T00:00:00GMT\"", zone), zone);
      assertEquals(micros("2026-11-22T00:00:00Z"), at("\"2026-11-22T01:00:00+01\"", zone), zone);
      assertEquals(micros("2026-11-22T00:00:00Z"), at("\" 2026-11-22T00:00:00Z \"", zone), zone);
      assertEquals(micros("2026-11-22T05:00:00Z"), at("\"2026-11-22T00:00:00 America/New_York\"", zone), zone);
    }
  }

  @Test
  void textWithoutAZoneIsReadInTheSessionZone() {
    for (String zone : ZONES) {
      ZoneId id = ZoneId.of(zone);
      LocalDateTime local = LocalDateTime.of(2026, 11, 22, 5, 6, 7);
      assertEquals(micros(local.atZone(id).toInstant()), at("\"2026-11-22T05:06:07\"", zone), zone);
      assertEquals(micros(local.atZone(id).toInstant()), at("\"2026-11-22 05:06:07\"", zone), zone);
      assertEquals(micros(local.withSecond(0).atZone(id).toInstant()), at("\"2026-11-22T05:06\"", zone), zone);
      assertEquals(micros(local.toLocalDate().atStartOfDay(id).toInstant()), at("\"2026-11-22\"", zone), zone);
      assertEquals(micros(local.withNano(250_000_000).atZone(id).toInstant()),
          at("\"2026-11-22T05:06:07.25\"", zone), zone);
    }
  }

  @Test
  void anIntegerIsEpochSecondsInEveryZone() {
    for (String zone : ZONES) {
      assertEquals(1_700_000_000_000_000L, at("1700000000", zone));
      assertEquals(0L, at("0", zone));
      assertEquals(-5_000_000L, at("-5", zone));
    }
  }

  @Test
  void whatIsNoTimestampIsUndecodable() {
    for (String json : List.of("\"\"", "\"x\"", "\"2026-02-29T00:00:00Z\"", "\"2026-11-22T24:00:00Z\"",
        "\"2026-11-22T05:60:00Z\"", "\"2026-13-01T00:00:00Z\"", "1700000000.0",
        "1.7e9", "100000000000000000000000000000", "true", "[1700000000]", "{}")) {
      assertEquals("undecodable", at(json), json);
    }
  }

  @Test
  void textReadWithoutSparksParserGivesWhatSparksParserGives() {
    Random random = new Random(7);
    List<String> texts = new ArrayList<>();
    long first = micros("0001-01-01T00:00:00Z");
    long last = micros("9999-12-31T23:59:59.999999Z");
    for (int count = 0; count < 2_000; count++) {
      Instant instant = Instant.EPOCH.plus(first + (long) (random.nextDouble() * (last - first)), ChronoUnit.MICROS);
      String iso = instant.toString();
      String seconds = iso.substring(0, 19);
      String fraction = String.format("%06d", instant.getNano() / 1_000).substring(0, random.nextInt(7));
      texts.add(seconds + (fraction.isEmpty() ? "" : "." + fraction) + "Z");
    }
    // Near misses, which Spark's parser reads or refuses as it sees fit.
    texts.addAll(List.of("2026-11-22t05:06:07Z", "2026-1-22T05:06:07Z", "2026-11-22T05:06:07z",
        "2026-11-22 05:06:07Z", "2026-11-22T05:06:60Z", "2026-11-22T23:59:59.9999999Z", "2100-02-29T00:00:00Z",
        "2000-02-29T00:00:00Z", "2026-04-31T00:00:00Z", "2026-00-10T00:00:00Z", "2026-11-00T00:00:00Z",
        "+2026-11-22T05:06:07Z", "2026-11-22T05:06:07.12a456Z", "2026-11-22T05:06:07,5Z", "2026/11/22T05:06:07Z",
        "2026-11-22T05-06:07Z", "20261-11-22T05:06:07Z", "2026-11-22T05:06:07.Z", "GMT2026-11-22T05:06:07Z",
        "2026-11-22GMT 05:06:07"));
    for (String text : texts) {
      for (String zone : ZONES) {
        assertEquals(spark(text, zone), at("\"" + text + "\"", zone), text + " in " + zone);
      }
    }
  }

  @Test
  void theFormProducersSendIsReadWithoutSparksParser() {
    for (String text : List.of("2026-11-22T05:06:07Z", "2026-11-22T05:06:07.1Z", "2026-11-22T05:06:07.123456Z")) {
      char[] padded = ("\"" + text + "\"").toCharArray();
      long read = JsonTimestamps.utcMicros(padded, 1, text.length());
      assertNotEquals(JsonTimestamps.NOT_UTC, read, text);
      assertEquals(micros(text), read, text);
    }
    assertEquals(JsonTimestamps.NOT_UTC, JsonTimestamps.utcMicros("2026-11-22T05:06:07".toCharArray(), 0, 19));
    assertEquals(JsonTimestamps.NOT_UTC, JsonTimestamps.utcMicros("2026-11-22T05:06:07+00:00".toCharArray(), 0, 25));
    // A date that does not exist is no text the fast path reads, not an error.
    assertEquals(JsonTimestamps.NOT_UTC, JsonTimestamps.utcMicros("2026-02-29T00:00:00Z".toCharArray(), 0, 20));
    assertEquals(JsonTimestamps.NOT_UTC, JsonTimestamps.utcMicros("2026-04-31T00:00:00Z".toCharArray(), 0, 20));
  }

  private static int status(String json) {
    return Decoders.status(decoder(EVENT, TIMESTAMPS, "UTC"), json);
  }

  @Test
  void epochSecondsFrom2000To2200AreValid() {
    assertEquals(StrictJson.VALID, status("{\"a\": 946684800, \"b\": 7258118400, \"c\": 1700000000}"));
  }

  @Test
  void aNumberOutsideTheYearsIsDecodedAndTheStatusIsItsFieldsPosition() {
    for (String seconds : List.of("946684799", "7258118401", "-5", "0", "1795356889000", "1795356889000000",
        "9223372036854775807", "-9223372036854775808")) {
      InternalRow decoded = Decoders.decoded(decoder(EVENT, TIMESTAMPS, "UTC"), "{\"b\": " + seconds + "}");
      assertEquals(2, decoded.getInt(1), seconds);
      // Decoded as Spark reads it: seconds times a million, unchecked.
      assertEquals(Long.parseLong(seconds) * 1_000_000L, decoded.getStruct(0, 4).getLong(1), seconds);
    }
  }

  @Test
  void theFirstPositionOutOfRangeCountsWhateverTheOrderOfTheMembers() {
    assertEquals(2, status("{\"c\": 5, \"b\": 5, \"a\": 1700000000}"));
    assertEquals(1, status("{\"c\": 5, \"b\": 5, \"a\": 5}"));
    assertEquals(1, status("{\"a\": 5, \"c\": 5}"));
    assertEquals(3, status("{\"c\": 5, \"b\": \"1990-01-01T00:00:00Z\", \"a\": null}"));
  }

  @Test
  void onlyNumbersInTopLevelTimestampFieldsAreChecked() {
    // Text is read, whatever year it names; its range is checked after the decoding.
    assertEquals(StrictJson.VALID, status("{\"a\": \"1990-01-01T00:00:00Z\", \"b\": \"2300-01-01T00:00:00Z\"}"));
    assertEquals(StrictJson.VALID, status("{\"n\": {\"t\": 5}, \"x\": 5, \"a\": null}"));
    // A number beyond 64 bits is no timestamp at all.
    assertEquals(StrictJson.UNDECODABLE, status("{\"a\": 100000000000000000000000000000}"));
    // A field named in the list that the event does not have is skipped like any other member.
    StrictJson decoder = decoder(EVENT, List.of("gone", "b"), "UTC");
    assertEquals(StrictJson.VALID, Decoders.status(decoder, "{\"gone\": 5}"));
    assertEquals(2, Decoders.status(decoder, "{\"b\": 5}"));
  }

  @Test
  void theYearsAreTheDecodersOwn() {
    StrictJson decoder = new StrictJson("test", EVENT, TIMESTAMPS, 0, 10, Decoders.MAX_DEPTH, "UTC");
    assertEquals(StrictJson.VALID, Decoders.status(decoder, "{\"a\": 0, \"b\": 10}"));
    assertEquals(1, Decoders.status(decoder, "{\"a\": -1}"));
    assertEquals(3, Decoders.status(decoder, "{\"c\": 1700000000}"));
  }

  @Test
  void aTimestampOutOfRangeInAnUndecodableValueLeavesItUndecodable() {
    assertEquals(StrictJson.UNDECODABLE, status("{\"a\": 5, \"b\": \"x\"}"));
    assertEquals(StrictJson.UNDECODABLE, status("{\"a\": 5} x"));
    assertTrue(Decoders.decoded(decoder(EVENT, TIMESTAMPS, "UTC"), "{\"a\": 5,}").isNullAt(0));
  }
}
