package io.bergstream.schemas;

import java.io.Serializable;
import java.util.List;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.objects.Invoke;
import org.apache.spark.sql.classic.ExpressionUtils;
import org.apache.spark.sql.types.AbstractDataType;
import org.apache.spark.sql.types.ObjectType;
import org.apache.spark.sql.types.StructType;
import scala.jdk.javaapi.CollectionConverters;

/** How bergstream's decoders reach Spark's plans. */
final class Decoding {
  private Decoding() {}

  /**
   * A column of {@code decoder.decode(value)}, of type {@code result}: an expression of Spark's own that
   * calls the decoder (serialized with the plan, one copy per task) from the projection's generated code,
   * and takes the internal row it builds as it is; null for a null value, without a call.
   */
  static Column column(Serializable decoder, StructType result, Column value) {
    Expression target = new Literal(decoder, new ObjectType(decoder.getClass()));
    Expression decode =
        new Invoke(
            target,
            "decode",
            result,
            CollectionConverters.asScala(List.of(ExpressionUtils.expression(value))).toSeq(),
            CollectionConverters.asScala(List.<AbstractDataType>of()).toSeq(),
            true,
            true,
            true);
    return ExpressionUtils.column(decode);
  }
}
