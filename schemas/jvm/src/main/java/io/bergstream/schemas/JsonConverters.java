package io.bergstream.schemas;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
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

/** A JSON value converted to a field's type as Spark's {@code from_json} converts it, token by token. */
final class JsonConverters {
  // Writes a value that is not a string again as JSON text; thread-safe, as Jackson's factories are.
  private static final JsonFactory WRITER = new JsonFactory();

  private JsonConverters() {}

  /** Turns the value at the parser's current token into Spark's internal value of a type. */
  interface Converter extends Serializable {
    Object convert(JsonParser parser, JsonToken token) throws IOException;
  }

  static final class NotConvertible extends RuntimeException {
    private static final long serialVersionUID = 1L;

    NotConvertible(JsonToken token, DataType type) {
      super(token + " is not " + type.simpleString(), null, false, false);
    }
  }

  /** A struct's fields by name, and the converter of each. */
  static final class Struct implements Serializable {
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
      return new JsonTimestamps(zoneId);
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
}
