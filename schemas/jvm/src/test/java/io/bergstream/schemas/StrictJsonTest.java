package io.bergstream.schemas;

import static io.bergstream.schemas.Decoders.concat;
import static io.bergstream.schemas.Decoders.decoded;
import static io.bergstream.schemas.Decoders.decoder;
import static io.bergstream.schemas.Decoders.event;
import static io.bergstream.schemas.Decoders.status;
import static java.nio.charset.StandardCharsets.UTF_16LE;
import static java.nio.charset.StandardCharsets.UTF_8;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/** The strict JSON decoder's statuses: what is one strict JSON object, and what of a value is not. */
class StrictJsonTest {
  private static final StructType EVENT =
      new StructType()
          .add("id", DataTypes.StringType)
          .add("account_id", DataTypes.LongType)
          .add("device", new StructType().add("os", DataTypes.StringType).add("type", DataTypes.StringType));
  private static final String VALID =
      "{\"id\":\"p1\",\"account_id\":42,\"device\":{\"os\":\"tvOS\",\"type\":\"tv\"},\"country\":\"US\"}";

  private static int status(String json) {
    return Decoders.status(decoder(EVENT), json);
  }

  private static int status(byte[] value) {
    return Decoders.status(decoder(EVENT), value);
  }

  /** VALID with {@code member} added as its last member. */
  private static String withMember(String member) {
    return VALID.substring(0, VALID.length() - 1) + "," + member + "}";
  }

  /** VALID with the country's text replaced by {@code raw}, as it stands in the JSON text. */
  private static String country(String raw) {
    return VALID.replace("\"country\":\"US\"", "\"country\":\"" + raw + "\"");
  }

  @Test
  void aValidObjectDecodesIntoItsEventWithStatusValid() {
    InternalRow decoded = decoded(decoder(EVENT), VALID);
    assertEquals(StrictJson.VALID, decoded.getInt(1));
    InternalRow event = decoded.getStruct(0, 3);
    assertEquals("p1", event.getUTF8String(0).toString());
    assertEquals(42L, event.getLong(1));
    assertEquals("tvOS", event.getStruct(2, 2).getUTF8String(0).toString());
    assertEquals("tv", event.getStruct(2, 2).getUTF8String(1).toString());
  }

  @Test
  void aNullValueGivesNull() {
    assertNull(decoder(EVENT).decode(null));
  }

  @Test
  void theResultIsTheEventThenTheStatus() {
    StructType result = StrictJson.resultType(EVENT);
    assertEquals(List.of(StrictJson.EVENT, StrictJson.STATUS), List.of(result.fieldNames()));
    assertEquals(EVENT, result.fields()[0].dataType());
    assertEquals(DataTypes.IntegerType, result.fields()[1].dataType());
  }

  @Test
  void fieldsTheValueLacksAreNullAndMembersTheEventLacksAreSkipped() {
    InternalRow event = event(decoder(EVENT), "{\"extra\":[1,{\"y\":null}],\"id\":\"p\",\"more\":{}}", 3);
    assertEquals("p", event.getUTF8String(0).toString());
    assertEquals(true, event.isNullAt(1));
    assertEquals(true, event.isNullAt(2));
    assertEquals(3, event(decoder(EVENT), "{}", 3).numFields());
  }

  @Test
  void anEscapedKeyNamesTheFieldItSpells() {
    assertEquals("US", event(decoder(new StructType().add("country", DataTypes.StringType)),
        "{\"c\\u006fu\\u006etry\":\"US\"}", 1).getUTF8String(0).toString());
  }

  @Test
  void theDecoderKeepsNothingFromOneValueToTheNext() {
    StrictJson decoder = decoder(EVENT);
    assertEquals(StrictJson.VALID, Decoders.status(decoder, VALID));
    assertEquals(StrictJson.UNDECODABLE, Decoders.status(decoder, VALID + "x"));
    InternalRow event = event(decoder, "{\"account_id\":7}", 3);
    assertEquals(true, event.isNullAt(0));
    assertEquals(7L, event.getLong(1));
  }

  @Test
  void aDecoderSentWithAPlanDecodesAsBefore() throws Exception {
    StrictJson decoder = decoder(EVENT, List.of(), "America/New_York");
    decoder.decode(VALID.getBytes(UTF_8));
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    try (ObjectOutputStream out = new ObjectOutputStream(bytes)) {
      out.writeObject(decoder);
    }
    StrictJson copy;
    try (ObjectInputStream in = new ObjectInputStream(new ByteArrayInputStream(bytes.toByteArray()))) {
      copy = (StrictJson) in.readObject();
    }
    assertEquals("test", copy.toString());
    assertEquals(StrictJson.VALID, Decoders.status(copy, VALID));
    assertEquals(StrictJson.UNDECODABLE, Decoders.status(copy, withMember("\"id\":\"again\"")));
  }

  @Test
  void everyProperPrefixOfAnObjectIsUndecodable() {
    for (int length = 0; length < VALID.length(); length++) {
      assertEquals(StrictJson.UNDECODABLE, status(VALID.substring(0, length)), VALID.substring(0, length));
    }
  }

  @ParameterizedTest
  @ValueSource(strings = {"[1, 2]", "[{\"id\":\"p\"}]", "\"{\\\"id\\\":\\\"p\\\"}\"", "123456789", "null",
      "true", "  \n ", "", "\"id\""})
  void aValueThatIsNotAnObjectIsUndecodable(String json) {
    assertEquals(StrictJson.UNDECODABLE, status(json));
  }

  @ParameterizedTest
  @ValueSource(strings = {"NaN", "-Infinity", "Infinity", "'US'", "01", "1.", ".5", "+1", "0x10", "\"a\" \"b\"",
      "[1,]", "{\"a\":1,}", "\"US\" /* a comment */", "\"U\\x53\""})
  void whatRfc8259RefusesIsUndecodableInAMemberTheEventLacksToo(String member) {
    assertEquals(StrictJson.UNDECODABLE, status(withMember("\"rate\":" + member)), member);
  }

  @Test
  void singleQuotesAndAnUnquotedKeyAreUndecodable() {
    assertEquals(StrictJson.UNDECODABLE, status(VALID.replace("\"country\"", "'country'")));
    assertEquals(StrictJson.UNDECODABLE, status(VALID.replace("\"country\"", "country")));
    assertEquals(StrictJson.UNDECODABLE, status(VALID.replace("\"US\"", "'US'")));
  }

  @Test
  void anUnescapedControlCharacterIsUndecodableAnEscapedOneIsText() {
    assertEquals(StrictJson.UNDECODABLE, status(country("U\u0001S")));
    assertEquals(StrictJson.UNDECODABLE, status(country("US\u0000")));
    assertEquals(StrictJson.UNDECODABLE, status(country("U\nS")));
    assertEquals(StrictJson.VALID, status(country("U\\u0001S\\n")));
  }

  @Test
  void blanksMayFollowTheObjectNothingElse() {
    assertEquals(StrictJson.VALID, status(VALID + "\r\n \t"));
    assertEquals(StrictJson.VALID, status(" \n" + VALID));
    for (String after : List.of("\n" + VALID, "]" + VALID, "xyz", "}", "]", "1", "null", ",", "\"\"")) {
      assertEquals(StrictJson.UNDECODABLE, status(VALID + after), after);
    }
  }

  @Test
  void aKeyTwiceInTheObjectIsUndecodableEvenIfTheEventLacksIt() {
    assertEquals(StrictJson.UNDECODABLE, status(withMember("\"account_id\":1")));
    assertEquals(StrictJson.UNDECODABLE, status(withMember("\"country\":\"US\"")));
    // The same key spelt with an escape is the same key.
    assertEquals(StrictJson.UNDECODABLE, status(withMember("\"c\\u006funtry\":\"US\"")));
  }

  @Test
  void aKeyTwiceInANestedObjectIsUndecodableAtAnyDepth() {
    assertEquals(StrictJson.UNDECODABLE, status(VALID.replace("\"device\":{", "\"device\":{\"os\":\"x\",")));
    assertEquals(StrictJson.UNDECODABLE, status("{\"a\":1,\"b\":{\"c\":[{\"d\":1,\"d\":2}]}}"));
    assertEquals(StrictJson.UNDECODABLE, status(withMember("\"x\":[[[{\"k\":{\"d\":1,\"e\":{},\"d\":[]}}]]]")));
    // The same key in two objects is no duplicate.
    assertEquals(StrictJson.VALID, status(withMember("\"x\":[{\"d\":1},{\"d\":2,\"e\":{\"d\":3}}]")));
  }

  /** VALID with a member the event lacks of arrays {@code depth} levels deep, counting VALID's object. */
  private static String nested(int depth, String open, String inner, String close) {
    return withMember("\"x\":" + open.repeat(depth - 1) + inner + close.repeat(depth - 1));
  }

  @Test
  void nestingUpToTheLimitDecodesOneLevelMoreIsUndecodable() {
    assertEquals(StrictJson.VALID, status(nested(Decoders.MAX_DEPTH, "[", "", "]")));
    assertEquals(StrictJson.UNDECODABLE, status(nested(Decoders.MAX_DEPTH + 1, "[", "", "]")));
    assertEquals(StrictJson.VALID, status(nested(Decoders.MAX_DEPTH, "{\"a\":", "1", "}")));
    assertEquals(StrictJson.UNDECODABLE, status(nested(Decoders.MAX_DEPTH + 1, "{\"a\":", "1", "}")));
    assertEquals(StrictJson.UNDECODABLE, status(nested(10_000, "[", "", "]")));
  }

  @Test
  void theDepthLimitIsTheDecodersOwn() {
    StrictJson shallow = new StrictJson("test", EVENT, List.of(), Decoders.EARLIEST, Decoders.LATEST, 3, "UTC");
    assertEquals(StrictJson.VALID, Decoders.status(shallow, "{\"x\":[[]]}"));
    assertEquals(StrictJson.UNDECODABLE, Decoders.status(shallow, "{\"x\":[[[]]]}"));
  }

  @Test
  void textInAnotherEncodingThanUtf8IsUndecodable() {
    byte[] bom = {(byte) 0xEF, (byte) 0xBB, (byte) 0xBF};
    assertEquals(StrictJson.UNDECODABLE, status(concat(bom, VALID.getBytes(UTF_8))));
    // Jackson would read UTF-16 and UTF-32 by the zero bytes among the first four; Spark reads UTF-8 only.
    assertEquals(StrictJson.UNDECODABLE, status(VALID.getBytes(UTF_16LE)));
    assertEquals(StrictJson.UNDECODABLE, status(VALID.getBytes(java.nio.charset.StandardCharsets.UTF_16BE)));
    assertEquals(StrictJson.UNDECODABLE, status(VALID.getBytes(java.nio.charset.Charset.forName("UTF-32LE"))));
    assertEquals(StrictJson.UNDECODABLE, status(new byte[] {'{', '}', 0}));
    assertEquals(StrictJson.UNDECODABLE, status(new byte[] {0}));
  }

  @Test
  void bytesThatAreNotUtf8AreTheirOwnStatusWhereverTheyStand() {
    // Latin-1's é, a lone continuation byte, a sequence cut short, an overlong slash, a surrogate in UTF-8.
    List<byte[]> broken = List.of(new byte[] {(byte) 0xE9}, new byte[] {(byte) 0x80},
        new byte[] {(byte) 0xE2, (byte) 0x9C}, new byte[] {(byte) 0xC0, (byte) 0xAF},
        new byte[] {(byte) 0xED, (byte) 0xA0, (byte) 0x80}, new byte[] {(byte) 0xFF});
    for (byte[] bytes : broken) {
      // At every place in a word of eight bytes, and in the bytes after the last whole word.
      for (int padding = 0; padding < 17; padding++) {
        byte[] value = concat(("{\"id\":\"" + "p".repeat(padding)).getBytes(UTF_8), bytes, "\"}".getBytes(UTF_8));
        assertEquals(StrictJson.INVALID_UTF8, status(value), padding + " bytes in");
      }
    }
    // Before whether the rest is JSON: a value cut short still says it is not UTF-8.
    assertEquals(StrictJson.INVALID_UTF8, status(new byte[] {'{', '"', 'i', 'd', '"', ':', '"', (byte) 0xE9}));
  }

  @Test
  void textOutsideAsciiInUtf8Decodes() {
    InternalRow event = event(decoder(EVENT), "{\"id\":\"xé✓ café 😀\",\"ключ\":\"значение\"}", 3);
    assertEquals("xé✓ café 😀", event.getUTF8String(0).toString());
  }

  @Test
  void escapedSurrogatePairsAreText() {
    InternalRow decoded = decoded(decoder(EVENT), "{\"id\":\"\\uD83D\\uDE00\\ud83d\\ude00\"}");
    assertEquals(StrictJson.VALID, decoded.getInt(1));
    assertEquals("😀😀", decoded.getStruct(0, 3).getUTF8String(0).toString());
  }

  @ParameterizedTest
  @ValueSource(strings = {"\\ude00", "\\ude00\\ud83d", "\\ud83d\\u0041", "\\ud83d", "\\uDBFF", "\\uDC00x",
      "\\ud83dUS", "\\\\ud800", "\\\\ude00", "\\ud83d\\ud83d\\ude00"})
  void halfOfASurrogatePairIsItsOwnStatusAndTheEventIsKept(String escaped) {
    InternalRow decoded = decoded(decoder(EVENT), country(escaped));
    assertEquals(StrictJson.LONE_SURROGATE, decoded.getInt(1), escaped);
    assertEquals("p1", decoded.getStruct(0, 3).getUTF8String(0).toString());
  }

  @Test
  void halfOfASurrogatePairIsFoundWhereverItStands() {
    for (int padding = 0; padding < 17; padding++) {
      assertEquals(StrictJson.LONE_SURROGATE, status("{\"id\":\"" + "p".repeat(padding) + "\\ud83d\"}"));
      assertEquals(StrictJson.VALID, status("{\"id\":\"" + "p".repeat(padding) + "\\ud83d\\ude00\"}"));
    }
    // In a key too, and at the value's very end.
    assertEquals(StrictJson.LONE_SURROGATE, status(withMember("\"\\udc00\":1")));
    assertEquals(StrictJson.LONE_SURROGATE, status("{\"id\":\"\\ud800\"}   "));
  }

  @Test
  void fewerThanFourHexadecimalDigitsAreNoEscapeAndUndecodable() {
    for (String escaped : List.of("\\ud83", "\\ud83d\\ude0", "\\ude0")) {
      assertEquals(StrictJson.UNDECODABLE, status(country(escaped)), escaped);
      assertEquals(false, JsonBytes.hasLoneSurrogate(country(escaped).getBytes(UTF_8)), escaped);
    }
  }

  @Test
  void whichStatusAValueGetsGoesNotUtf8ThenUndecodableThenHalfAPair() {
    StrictJson decoder = decoder(EVENT.add("at", DataTypes.TimestampType), List.of("at"), "UTC");
    byte[] notUtf8 = {'{', '"', 'i', 'd', '"', ':', '"', '\\', 'u', 'd', '8', '0', '0', (byte) 0xE9, '"'};
    assertEquals(StrictJson.INVALID_UTF8, Decoders.status(decoder, notUtf8));
    assertEquals(StrictJson.UNDECODABLE, Decoders.status(decoder, "{\"id\":\"\\ud800\",}"));
    assertNull(decoded(decoder, "{\"id\":\"\\ud800\",}").getStruct(0, 4));
    assertEquals(1, Decoders.status(decoder, "{\"id\":\"p\",\"at\":5}"));
    // Half a pair goes before a timestamp out of range.
    assertEquals(StrictJson.LONE_SURROGATE, Decoders.status(decoder, "{\"id\":\"\\ud800\",\"at\":5}"));
  }
}
