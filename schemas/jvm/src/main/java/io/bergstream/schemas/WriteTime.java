package io.bergstream.schemas;

import java.nio.charset.StandardCharsets;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

/**
 * A micro-batch's write time, in microseconds, from its decimal digits as bytes (the rules are
 * bergstream.schemas.stamp's {@code write_time}).
 *
 * <p>Spark folds the digits of {@code current_timestamp()} into a binary literal, which its generated code
 * holds as a reference, not as text: the code is the same from batch to batch and is compiled once. A
 * literal timestamp would be written into the code's text, and {@code reflect}, which also keeps it out,
 * takes the whole projection out of whole-stage code generation. The digits are the same array for every
 * row of a batch, so they are read once per batch and task.
 */
public final class WriteTime implements UDF1<byte[], Long> {
  private static final long serialVersionUID = 1L;

  /** The digits last read and their value, replaced together. */
  private record Read(byte[] digits, Long micros) {}

  private transient volatile Read last;

  /** The write time of {@code digits} (a binary column of decimal digits), as microseconds. */
  public static Column column(Column digits) {
    return functions.udf(new WriteTime(), DataTypes.LongType).apply(digits);
  }

  @Override
  public Long call(byte[] digits) {
    if (digits == null) {
      return null;
    }
    Read read = last;
    if (read == null || read.digits() != digits) {
      read = new Read(digits, Long.parseLong(new String(digits, StandardCharsets.US_ASCII)));
      last = read;
    }
    return read.micros();
  }
}
