package io.bergstream.schemas;

import static java.nio.charset.StandardCharsets.UTF_8;

import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;

/** The strict JSON decoder as the router builds it (2000 to 2200, 999 levels), and what it makes of a value. */
final class Decoders {
  static final long EARLIEST = 946_684_800L;
  static final long LATEST = 7_258_118_400L;
  static final int MAX_DEPTH = 999;

  private Decoders() {}

  static StrictJson decoder(StructType event, List<String> timestamps, String zone) {
    return new StrictJson("test", event, timestamps, EARLIEST, LATEST, MAX_DEPTH, zone);
  }

  static StrictJson decoder(StructType event) {
    return decoder(event, List.of(), "UTC");
  }

  /** An event of one field {@code x} of {@code type}. */
  static StrictJson decoderOf(DataType type) {
    return decoder(new StructType().add("x", type));
  }

  static InternalRow decoded(StrictJson decoder, String json) {
    return decoder.decode(json.getBytes(UTF_8));
  }

  static int status(StrictJson decoder, byte[] value) {
    return decoder.decode(value).getInt(1);
  }

  static int status(StrictJson decoder, String json) {
    return status(decoder, json.getBytes(UTF_8));
  }

  /** The decoded event, which must be there. */
  static InternalRow event(StrictJson decoder, String json, int fields) {
    InternalRow decoded = decoded(decoder, json);
    InternalRow event = decoded.getStruct(0, fields);
    if (event == null) {
      throw new AssertionError(json + " did not decode: status " + decoded.getInt(1));
    }
    return event;
  }

  /** Field {@code x} of the value {@code {"x": json}} decoded, as Spark holds it. */
  static Object x(StrictJson decoder, String json, DataType type) {
    return event(decoder, "{\"x\": " + json + "}", 1).get(0, type);
  }

  static byte[] concat(byte[]... parts) {
    int length = 0;
    for (byte[] part : parts) {
      length += part.length;
    }
    byte[] whole = new byte[length];
    int at = 0;
    for (byte[] part : parts) {
      System.arraycopy(part, 0, whole, at, part.length);
      at += part.length;
    }
    return whole;
  }
}
