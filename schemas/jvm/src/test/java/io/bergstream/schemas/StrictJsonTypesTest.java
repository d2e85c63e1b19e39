package io.bergstream.schemas;

import static io.bergstream.schemas.Decoders.decoderOf;
import static io.bergstream.schemas.Decoders.event;
import static io.bergstream.schemas.Decoders.status;
import static io.bergstream.schemas.Decoders.x;
import static java.nio.charset.StandardCharsets.UTF_8;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.LocalDate;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/** Each field type as the strict JSON decoder converts it: Spark's from_json's values, and its refusals. */
class StrictJsonTypesTest {
  private static Object x(DataType type, String json) {
    return Decoders.x(decoderOf(type), json, type);
  }

  /** Whether {@code {"x": json}} is undecodable for a field {@code x} of {@code type}. */
  private static boolean refused(DataType type, String json) {
    return status(decoderOf(type), "{\"x\": " + json + "}") == StrictJson.UNDECODABLE;
  }

  private static String text(String json) {
    return x(DataTypes.StringType, json).toString();
  }

  @Test
  void aStringIsItsTextEscapesDecoded() {
    assertEquals("x", text("\"x\""));
    assertEquals("", text("\"\""));
    assertEquals("xé😀\n/\"\\", text("\"x\\u00e9\\ud83d\\ude00\\n\\/\\\"\\\\\""));
    assertEquals("xé✓ café", text("\"xé✓ café\""));
  }

  @Test
  void aNumberBooleanObjectOrArrayForAStringIsKeptAsItsJsonText() {
    assertEquals("1", text("1"));
    assertEquals("-17", text("-17"));
    assertEquals("9223372036854775808", text("9223372036854775808"));
    assertEquals("100000000000000000000000000000", text("100000000000000000000000000000"));
    assertEquals("1.5", text("1.50"));
    assertEquals("100.0", text("1e2"));
    assertEquals("true", text("true"));
    assertEquals("false", text("false"));
    assertEquals("{\"x\":{\"y\":[1,2.5,\"z\"]}}", text("{\"x\" : {\"y\": [1, 2.5, \"z\"]}}"));
    assertEquals("[]", text("[]"));
    assertEquals("[1,null,\"é\\n\"]", text("[1, null, \"é\\n\"]"));
  }

  @Test
  void anIntIsAJsonIntegerInThirtyTwoBits() {
    assertEquals(2147483647, x(DataTypes.IntegerType, "2147483647"));
    assertEquals(-2147483648, x(DataTypes.IntegerType, "-2147483648"));
    assertEquals(0, x(DataTypes.IntegerType, "-0"));
    for (String json : List.of("2147483648", "-2147483649", "4294967296", "1.0", "1e2", "\"1\"", "true", "[1]",
        "{}")) {
      assertTrue(refused(DataTypes.IntegerType, json), json);
    }
  }

  @Test
  void aLongIsAJsonIntegerInSixtyFourBits() {
    assertEquals(Long.MAX_VALUE, x(DataTypes.LongType, "9223372036854775807"));
    assertEquals(Long.MIN_VALUE, x(DataTypes.LongType, "-9223372036854775808"));
    assertEquals(-17L, x(DataTypes.LongType, "-17"));
    for (String json : List.of("9223372036854775808", "-9223372036854775809", "18446744073709551616", "1.5",
        "\"abc\"", "\"1\"", "false", "{}")) {
      assertTrue(refused(DataTypes.LongType, json), json);
    }
  }

  @Test
  void integerTypesNarrowerThanThirtyTwoBitsHaveNoDecoding() {
    // Avro, and so an event's schema, has no narrower integers.
    assertThrows(IllegalArgumentException.class, () -> decoderOf(DataTypes.ShortType));
    assertThrows(IllegalArgumentException.class, () -> decoderOf(DataTypes.ByteType));
    assertThrows(IllegalArgumentException.class, () -> decoderOf(DataTypes.createDecimalType(10, 2)));
    assertThrows(IllegalArgumentException.class, () -> decoderOf(DataTypes.TimestampNTZType));
    assertThrows(IllegalArgumentException.class,
        () -> decoderOf(DataTypes.createMapType(DataTypes.IntegerType, DataTypes.LongType)));
  }

  @Test
  void aDoubleIsAnyJsonNumber() {
    assertEquals(1.5, x(DataTypes.DoubleType, "1.50"));
    assertEquals(1.0, x(DataTypes.DoubleType, "1"));
    assertEquals(0.001, x(DataTypes.DoubleType, "0.1e-2"));
    assertEquals(-0.0, x(DataTypes.DoubleType, "-0.0"));
    assertEquals(9.223372036854776E18, x(DataTypes.DoubleType, "9223372036854775808"));
    // Beyond a double's range, as from_json reads it: infinite.
    assertEquals(Double.POSITIVE_INFINITY, x(DataTypes.DoubleType, "1.7976931348623157E309"));
    for (String json : List.of("\"1.5\"", "\"NaN\"", "NaN", "Infinity", "true", "[]")) {
      assertTrue(refused(DataTypes.DoubleType, json), json);
    }
  }

  @Test
  void aFloatIsAnyJsonNumberRoundedToThirtyTwoBits() {
    assertEquals(1.5f, x(DataTypes.FloatType, "1.50"));
    assertEquals(0.1f, x(DataTypes.FloatType, "0.1"));
    assertEquals(-17f, x(DataTypes.FloatType, "-17"));
    assertEquals(Float.POSITIVE_INFINITY, x(DataTypes.FloatType, "3.5e39"));
    for (String json : List.of("\"1.5\"", "\"Infinity\"", "false", "{}")) {
      assertTrue(refused(DataTypes.FloatType, json), json);
    }
  }

  @Test
  void aBooleanIsTrueOrFalseOnly() {
    assertEquals(true, x(DataTypes.BooleanType, "true"));
    assertEquals(false, x(DataTypes.BooleanType, "false"));
    for (String json : List.of("\"true\"", "1", "0", "[]", "True")) {
      assertTrue(refused(DataTypes.BooleanType, json), json);
    }
  }

  @Test
  void bytesAreBase64Text() {
    assertArrayEquals("hello".getBytes(UTF_8), (byte[]) x(DataTypes.BinaryType, "\"aGVsbG8=\""));
    assertArrayEquals(new byte[0], (byte[]) x(DataTypes.BinaryType, "\"\""));
    for (String json : List.of("\"!!\"", "12", "[104]", "true")) {
      assertTrue(refused(DataTypes.BinaryType, json), json);
    }
  }

  @Test
  void aDateIsIsoTextOrDaysSince1970AsText() {
    int day = (int) LocalDate.of(2026, 11, 22).toEpochDay();
    assertEquals(day, x(DataTypes.DateType, "\"2026-11-22\""));
    assertEquals(day, x(DataTypes.DateType, "\"2026-11-22T05:06:07Z\""));
    assertEquals(day, x(DataTypes.DateType, "\" 2026-11-22 \""));
    assertEquals((int) LocalDate.of(2026, 1, 2).toEpochDay(), x(DataTypes.DateType, "\"2026-1-2\""));
    assertEquals(day, x(DataTypes.DateType, "\"2026-11-22GMT\""));
    assertEquals(99, x(DataTypes.DateType, "\"99\""));
    // Four digits or more are a year, as Spark's reading of a date takes them, not days.
    assertEquals((int) LocalDate.of(12345, 1, 1).toEpochDay(), x(DataTypes.DateType, "\"12345\""));
    assertEquals((int) LocalDate.of(-354290, 1, 1).toEpochDay(), x(DataTypes.DateType, "\"-354290\""));
    for (String json : List.of("\"\"", "\"x\"", "\"2026-02-30\"", "20000", "true")) {
      assertTrue(refused(DataTypes.DateType, json), json);
    }
  }

  @Test
  void jsonNullIsNullForEveryType() {
    List<DataType> types = List.of(DataTypes.StringType, DataTypes.IntegerType, DataTypes.LongType,
        DataTypes.DoubleType, DataTypes.FloatType, DataTypes.BooleanType, DataTypes.BinaryType,
        DataTypes.TimestampType, DataTypes.DateType, new StructType().add("y", DataTypes.LongType),
        DataTypes.createArrayType(DataTypes.LongType),
        DataTypes.createMapType(DataTypes.StringType, DataTypes.LongType));
    for (DataType type : types) {
      InternalRow event = event(decoderOf(type), "{\"x\": null}", 1);
      assertTrue(event.isNullAt(0), type.simpleString());
    }
  }

  private static final StructType NESTED =
      new StructType()
          .add("y", DataTypes.StringType)
          .add("t", DataTypes.TimestampType)
          .add("z", new StructType().add("w", DataTypes.LongType));

  @Test
  void aNestedStructHasItsFieldsByNameTheRestSkippedTheMissingNull() {
    InternalRow nested = (InternalRow) x(NESTED, "{\"extra\": [{}], \"z\": {\"w\": 3}, \"y\": 5}");
    assertEquals("5", nested.getUTF8String(0).toString());
    assertTrue(nested.isNullAt(1));
    assertEquals(3L, nested.getStruct(2, 1).getLong(0));
    assertTrue(((InternalRow) x(NESTED, "{}")).isNullAt(0));
    for (String json : List.of("[]", "\"{}\"", "1", "{\"z\": 3}", "{\"y\": \"a\", \"y\": \"b\"}",
        "{\"z\": {\"w\": 1.5}}")) {
      assertTrue(refused(NESTED, json), json);
    }
  }

  @Test
  void anArrayHoldsItsElementsInOrderNullsIncluded() {
    ArrayData longs = (ArrayData) x(DataTypes.createArrayType(DataTypes.LongType), "[1, null, 3]");
    assertEquals(3, longs.numElements());
    assertEquals(1L, longs.getLong(0));
    assertTrue(longs.isNullAt(1));
    assertEquals(3L, longs.getLong(2));
    assertEquals(0, ((ArrayData) x(DataTypes.createArrayType(DataTypes.LongType), "[]")).numElements());
    DataType records = DataTypes.createArrayType(new StructType().add("x", DataTypes.LongType));
    ArrayData structs = (ArrayData) x(records, "[{\"x\": 1}, {\"x\": null}, {}]");
    assertEquals(1L, structs.getStruct(0, 1).getLong(0));
    assertTrue(structs.getStruct(1, 1).isNullAt(0));
    assertTrue(structs.getStruct(2, 1).isNullAt(0));
    for (String json : List.of("[1, \"2\"]", "1", "{}", "[1.5]", "[[1]]")) {
      assertTrue(refused(DataTypes.createArrayType(DataTypes.LongType), json), json);
    }
  }

  @Test
  void aMapHoldsEveryMemberOfItsObject() {
    DataType type = DataTypes.createMapType(DataTypes.StringType, DataTypes.LongType);
    MapData map = (MapData) x(type, "{\"k\": 1, \"j\": null, \"\\u00e9\": 3}");
    List<String> keys = new ArrayList<>();
    for (int at = 0; at < map.numElements(); at++) {
      keys.add(map.keyArray().getUTF8String(at).toString());
    }
    assertEquals(List.of("k", "j", "é"), keys);
    assertEquals(1L, map.valueArray().getLong(0));
    assertTrue(map.valueArray().isNullAt(1));
    assertEquals(3L, map.valueArray().getLong(2));
    assertEquals(0, ((MapData) x(type, "{}")).numElements());
    for (String json : List.of("{\"k\": \"1\"}", "[]", "{\"k\": 1, \"k\": 2}", "\"k\"")) {
      assertTrue(refused(type, json), json);
    }
  }

  @Test
  void aFieldThatDoesNotConvertMakesTheWholeValueUndecodable() {
    StructType event = new StructType().add("s", DataTypes.StringType).add("i", DataTypes.IntegerType);
    InternalRow decoded = Decoders.decoded(Decoders.decoder(event), "{\"s\": \"x\", \"i\": \"fast\"}");
    assertEquals(StrictJson.UNDECODABLE, decoded.getInt(1));
    assertNull(decoded.getStruct(0, 2));
  }

  @ParameterizedTest
  @ValueSource(strings = {"[1,{\"a\":[]}]", "{\"y\":{\"z\":null}}", "\"s\"", "-1.5e-300", "null", "true"})
  void aMemberTheEventLacksIsSkippedWhateverItHolds(String json) {
    InternalRow event = event(decoderOf(DataTypes.LongType), "{\"other\": " + json + ", \"x\": 7}", 1);
    assertEquals(7L, event.getLong(0));
  }
}
