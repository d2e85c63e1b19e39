package io.bergstream.schemas;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;

/**
 * What a JSON value's bytes say before Jackson reads them: whether they can be UTF-8 as Spark reads it, and
 * whether a string escapes half of a UTF-16 surrogate pair.
 */
final class JsonBytes {
  // Eight bytes of a value at a time; the bit that only a byte outside ASCII has set, in each.
  private static final VarHandle EIGHT_BYTES =
      MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
  private static final long HIGH_BITS = 0x8080808080808080L;
  private static final long EIGHT_ONES = 0x0101010101010101L;
  private static final long EIGHT_BACKSLASHES = 0x5C5C5C5C5C5C5C5CL;
  static final int NON_ASCII = 1;
  static final int BACKSLASH = 2;

  private JsonBytes() {}

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
