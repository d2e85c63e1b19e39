package io.bergstream.schemas;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.util.Arrays;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.EncoderFactory;
import org.apache.spark.sql.catalyst.InternalRow;
import org.junit.jupiter.api.Test;

/** The strict Avro decoder: a record that ends where the value does, and what it says of one that does not. */
class StrictAvroTest {
  private static final String SCHEMA =
      "{\"type\":\"record\",\"name\":\"play\",\"fields\":["
          + "{\"name\":\"title\",\"type\":\"string\"},{\"name\":\"seconds\",\"type\":\"long\"}]}";

  private static byte[] encoded(String title, long seconds) throws IOException {
    Schema schema = new Schema.Parser().parse(SCHEMA);
    GenericRecord record = new GenericData.Record(schema);
    record.put("title", title);
    record.put("seconds", seconds);
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    BinaryEncoder encoder = EncoderFactory.get().binaryEncoder(bytes, null);
    new GenericDatumWriter<GenericRecord>(schema).write(record, encoder);
    encoder.flush();
    return bytes.toByteArray();
  }

  private static StrictAvro decoder() throws ReflectiveOperationException {
    var made = StrictAvro.class.getDeclaredConstructor(String.class, String.class, String.class);
    made.setAccessible(true);
    return made.newInstance("play", SCHEMA, SCHEMA);
  }

  @Test
  void aValidRecordDecodesIntoItsEvent() throws Exception {
    InternalRow decoded = decoder().decode(encoded("Dark", 42));
    assertEquals(StrictAvro.VALID, decoded.getInt(1));
    InternalRow event = decoded.getStruct(0, 2);
    assertEquals("Dark", event.getUTF8String(0).toString());
    assertEquals(42L, event.getLong(1));
  }

  @Test
  void bytesAfterTheRecordAndGarbageAreToldApart() throws Exception {
    StrictAvro decoder = decoder();
    byte[] valid = encoded("Dark", 42);
    byte[] longer = Arrays.copyOf(valid, valid.length + 3);
    InternalRow leftOver = decoder.decode(longer);
    assertEquals(StrictAvro.LEFT_OVER, leftOver.getInt(1));
    assertNull(leftOver.getStruct(0, 2));
    // A length prefix past the value's end: the decoder runs out of bytes.
    assertEquals(StrictAvro.UNDECODABLE, decoder.decode(new byte[] {(byte) 0x7e}).getInt(1));
    // The decoder reuses its record: the next valid value decodes whole again.
    assertEquals("Lupin", decoder.decode(encoded("Lupin", 7)).getStruct(0, 2).getUTF8String(0).toString());
    assertNull(decoder.decode(null));
  }
}
