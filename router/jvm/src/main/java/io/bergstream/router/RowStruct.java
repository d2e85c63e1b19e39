package io.bergstream.router;

import java.nio.ByteBuffer;
import java.util.List;
import org.apache.iceberg.StructLike;
import org.apache.iceberg.types.Type;
import org.apache.iceberg.types.Types;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.Decimal;

/**
 * A Spark internal row seen as an Iceberg struct of the table's columns (in the same order), for a
 * partition key to read the values its transforms take: Spark's representations turned into Iceberg's
 * (a string as a CharSequence, a binary as a ByteBuffer, a decimal as a BigDecimal, a struct as a struct).
 * Timestamps and dates are the same in both: micros and days. One view per row type, rewrapped per row.
 */
final class RowStruct implements StructLike {
  private final List<Types.NestedField> fields;
  private final RowStruct[] nested;
  private InternalRow row;

  RowStruct(Types.StructType type) {
    this.fields = type.fields();
    this.nested = new RowStruct[fields.size()];
    for (int i = 0; i < fields.size(); i++) {
      Type fieldType = fields.get(i).type();
      if (fieldType.isStructType()) {
        nested[i] = new RowStruct(fieldType.asStructType());
      }
    }
  }

  RowStruct wrap(InternalRow wrapped) {
    this.row = wrapped;
    return this;
  }

  @Override
  public int size() {
    return fields.size();
  }

  @Override
  public <T> T get(int pos, Class<T> javaClass) {
    if (row.isNullAt(pos)) {
      return null;
    }
    Type type = fields.get(pos).type();
    Object value =
        switch (type.typeId()) {
          case BOOLEAN -> row.getBoolean(pos);
          case INTEGER, DATE -> row.getInt(pos);
          case LONG, TIME, TIMESTAMP, TIMESTAMP_NANO -> row.getLong(pos);
          case FLOAT -> row.getFloat(pos);
          case DOUBLE -> row.getDouble(pos);
          case STRING -> row.getUTF8String(pos).toString();
          case BINARY, FIXED -> ByteBuffer.wrap(row.getBinary(pos));
          case UUID -> java.util.UUID.fromString(row.getUTF8String(pos).toString());
          case DECIMAL -> {
            Types.DecimalType decimal = (Types.DecimalType) type;
            Decimal spark = row.getDecimal(pos, decimal.precision(), decimal.scale());
            yield spark.toJavaBigDecimal();
          }
          case STRUCT -> nested[pos].wrap(row.getStruct(pos, nested[pos].size()));
          default ->
              throw new UnsupportedOperationException(
                  "a partition of a " + type + " column (" + fields.get(pos).name() + ")");
        };
    return javaClass.cast(value);
  }

  @Override
  public <T> void set(int pos, T value) {
    throw new UnsupportedOperationException("a row's view is read, never written");
  }
}
