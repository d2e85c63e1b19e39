package io.bergstream.router;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.io.ObjectStreamClass;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.internal.SQLConf$;
import scala.jdk.javaapi.CollectionConverters;
import org.apache.spark.sql.catalyst.plans.logical.LeafNode;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.types.StructType;
import scala.collection.immutable.Seq;

/**
 * One topic's rows from Kafka records, planned once: the projections of a frame built over an empty
 * relation of the Kafka source's columns, in their order (the router's parse, check and stamp, as {@code a} and {@code
 * d}: TopicTables), applied in turn to each record of the topic inside a task.
 *
 * <p>Building a topic's frame over each micro-batch would cost Spark's analysis and planning every batch
 * for every topic with records: for a router of hundreds of topics, most of the driver's time. The plan
 * depends only on the topic's schema; it is kept until that changes. Topics planned alike share one plan
 * (bergstream.router.together.shared_plan: a record's topic is a column, not a constant), hence one
 * broadcast (TopicTables) and one compiled copy per executor thread.
 */
public final class TopicRows implements Serializable {
  private static final long serialVersionUID = 1L;
  /** Each projection's expressions and its input's attributes, from the records up. */
  private final List<Seq<Expression>> expressions;
  private final List<Seq<Attribute>> inputs;
  private final StructType archiveType;
  private final StructType deadLetterType;
  private final RowLayout layout;
  /** Names this plan in the executors' threads' caches of its compiled projections. */
  private final String id = UUID.randomUUID().toString();
  /**
   * Each executor thread's compiled projections, by plan: generating a topic's code costs tens of
   * milliseconds, paid once per thread instead of once per task and topic. Projections hold their
   * output row, so a thread's are its own.
   */
  private static final ThreadLocal<Map<String, List<UnsafeProjection>>> COMPILED =
      ThreadLocal.withInitial(
          () ->
              new LinkedHashMap<>(16, 0.75f, true) {
                @Override
                protected boolean removeEldestEntry(Map.Entry<String, List<UnsafeProjection>> eldest) {
                  return size() > MOST_COMPILED; // plans of schemas since replaced
                }
              });
  private static final int MOST_COMPILED = 4096;

  private TopicRows(
      List<Seq<Expression>> expressions, List<Seq<Attribute>> inputs, StructType output, String[] names) {
    this.expressions = expressions;
    this.inputs = inputs;
    this.archiveType = (StructType) output.apply("a").dataType();
    this.deadLetterType = (StructType) output.apply("d").dataType();
    this.layout = RowLayout.of(archiveType, deadLetterType, names[0], names[1], names[2], names[3], names[4]);
  }

  /**
   * The plan of {@code template}: projections only, over a relation of the records' columns. The rows'
   * metadata struct is the field {@code metadata}, with the fields {@code ingestion}, {@code partition},
   * {@code offset} and {@code writeTime} (bergstream.schemas.archive names them).
   */
  @SuppressWarnings("unchecked")
  public static TopicRows of(Dataset<Row> template, String metadata, String ingestion, String partition,
      String offset, String writeTime) {
    String[] names = {metadata, ingestion, partition, offset, writeTime};
    // Optimized, as Spark runs a frame: projections collapsed where that parses nothing twice, constants
    // folded (the write time among them: TopicTables sets it per batch).
    LogicalPlan plan = template.queryExecution().optimizedPlan();
    List<Seq<Expression>> expressions = new ArrayList<>();
    List<Seq<Attribute>> inputs = new ArrayList<>();
    while (plan instanceof Project project) {
      expressions.add((Seq<Expression>) (Seq<?>) project.projectList());
      inputs.add(project.child().output());
      plan = project.child();
    }
    if (!(plan instanceof LeafNode) || expressions.isEmpty()) {
      throw new IllegalArgumentException(
          "a topic's rows must be projections of the records alone, not " + plan.nodeName());
    }
    Collections.reverse(expressions);
    Collections.reverse(inputs);
    return new TopicRows(expressions, inputs, template.schema(), names);
  }

  String id() {
    return id;
  }

  StructType archiveType() {
    return archiveType;
  }

  StructType deadLetterType() {
    return deadLetterType;
  }

  RowLayout layout() {
    return layout;
  }

  /**
   * This thread's compiled projections of the plan, initialized for the task's {@code partition}: the
   * plan itself is shared by every task of the executor (a broadcast), its projections are not.
   */
  List<UnsafeProjection> projections(int partition) {
    List<UnsafeProjection> compiled =
        COMPILED
            .get()
            .computeIfAbsent(
                id,
                key -> {
                  // The thread's own copy of the expressions: an expression may keep state between rows
                  // (a decoder and the record it reuses), and the plan is shared by the executor's threads.
                  TopicRows own = copied();
                  List<UnsafeProjection> made = new ArrayList<>(expressions.size());
                  // Compiled whichever way the job reads Kafka's rows (TopicTables.write): they run for
                  // every row of the thread's tasks.
                  SQLConf generated = new SQLConf();
                  CollectionConverters.asJava(SQLConf.get().getAllConfs()).forEach(generated::setConfString);
                  generated.setConfString(TopicTables.FACTORY_MODE, "FALLBACK");
                  SQLConf$.MODULE$.withExistingConf(generated, () -> {
                    for (int i = 0; i < expressions.size(); i++) {
                      made.add(UnsafeProjection.create(own.expressions.get(i), own.inputs.get(i)));
                    }
                    return made;
                  });
                  return made;
                });
    for (UnsafeProjection projection : compiled) {
      projection.initialize(partition);
    }
    return compiled;
  }

  /** A copy of this plan that shares no object with it, made through Java serialization. */
  TopicRows copied() {
    try {
      ByteArrayOutputStream bytes = new ByteArrayOutputStream();
      try (ObjectOutputStream out = new ObjectOutputStream(bytes)) {
        out.writeObject(this);
      }
      try (ObjectInputStream in = new ThreadLoaderInput(new ByteArrayInputStream(bytes.toByteArray()))) {
        return (TopicRows) in.readObject();
      }
    } catch (IOException error) {
      throw new UncheckedIOException("copying the plan of a topic's rows", error);
    } catch (ClassNotFoundException error) {
      throw new IllegalStateException("copying the plan of a topic's rows", error);
    }
  }

  /** Classes resolved by the thread's loader: the one that holds Spark's jars and bergstream's. */
  private static final class ThreadLoaderInput extends ObjectInputStream {
    ThreadLoaderInput(InputStream in) throws IOException {
      super(in);
    }

    @Override
    protected Class<?> resolveClass(ObjectStreamClass described) throws IOException, ClassNotFoundException {
      ClassLoader loader = Thread.currentThread().getContextClassLoader();
      if (loader != null) {
        try {
          return Class.forName(described.getName(), false, loader);
        } catch (ClassNotFoundException notThere) {
          // a class of the JDK's, or of the loader that loaded this one
        }
      }
      return super.resolveClass(described);
    }
  }

  /** The record's {@code (a, d)} row through {@code projections}; valid until the next call. */
  static InternalRow apply(List<UnsafeProjection> projections, InternalRow record) {
    InternalRow row = record;
    for (UnsafeProjection projection : projections) {
      row = projection.apply(row);
    }
    return row;
  }
}
