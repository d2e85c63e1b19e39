package io.bergstream.backfill;

import java.io.Closeable;
import java.io.IOException;
import java.io.Serializable;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.FileScanTask;
import org.apache.iceberg.Schema;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableProperties;
import org.apache.iceberg.spark.source.SparkTable;
import org.apache.iceberg.types.Type;
import org.apache.iceberg.types.Types;
import org.apache.spark.paths.SparkPath;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.datasources.PartitionedFile;
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.MetadataBuilder;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Function1;
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The archive's Parquet files read by Spark's own vectorized Parquet reader, which decodes nested columns
 * (the {@code __metadata__} struct and its headers) a column at a time, where Iceberg's reader falls back
 * to a row at a time for any table with a nested column. Columns are matched by their Iceberg field ids,
 * so renamed and added columns read as Iceberg reads them. A split whose files this reader cannot read
 * as Iceberg would (another format, delete files) is read by Iceberg's reader, and so is every split of a
 * table whose files have no field ids (a name mapping) or types Spark reads otherwise, or whose storage
 * Hadoop's FileSystem does not reach.
 */
final class ParquetFiles {
  private static final Logger LOG = LoggerFactory.getLogger(ParquetFiles.class);
  private static final String FIELD_ID = "parquet.field.id";
  private static final String VECTORED_IO = "parquet.hadoop.vectored.io.enabled";

  private final SparkSession session;
  private final StructType schema;
  private final Plan plan;
  // Made once: each epoch's reader sets the same Parquet keys in it before it is broadcast.
  private final Configuration hadoop;
  private Reader unfiltered;

  private ParquetFiles(SparkSession session, StructType schema, Plan plan, boolean local) {
    this.session = session;
    this.schema = schema;
    this.plan = plan;
    this.hadoop = session.sessionState().newHadoopConf();
    if (local && hadoop.get(VECTORED_IO) == null) {
      // Hadoop's local file system serves vectored reads through an asynchronous channel and a thread
      // pool: for files in the page cache, slower than plain reads (bench/README, "An epoch's tasks").
      // Object stores keep Parquet's default, where vectored reads fetch ranges in parallel.
      hadoop.setBoolean(VECTORED_IO, false);
    }
  }

  /** One split of a data file: the row groups whose midpoints fall in [start, start + length). */
  record Slice(String path, long start, long length, long fileSize) implements Serializable {
    long end() {
      return start + length;
    }
  }

  /** The reader of `schema`'s rows from `iceberg`'s files, or null where Iceberg's reader must read them. */
  static ParquetFiles of(SupportsRead iceberg, StructType schema, Plan plan) {
    if (!(iceberg instanceof SparkTable sparkTable)) {
      return null;
    }
    Table table = sparkTable.table();
    String why = refusal(table, plan);
    StructType withIds = null;
    if (why == null) {
      withIds = (StructType) withFieldIds(schema, schemaOf(table, plan).asStruct());
      if (withIds == null) {
        why = "its schema has types Spark's Parquet reader reads otherwise than Iceberg's";
      }
    }
    if (why != null) {
      LOG.info("bergstream-backfill: {} is read by Iceberg's row reader: {}", plan.table, why);
      return null;
    }
    SparkSession active = SparkSession.active();
    // A session of its own, with the caller's settings, that matches columns by field id.
    SparkSession session = active.newSession();
    Map<String, String> settings = CollectionConverters.asJava(active.conf().getAll());
    settings.forEach((key, value) -> {
      if (key.startsWith("spark.sql.") && session.conf().isModifiable(key)) {
        session.conf().set(key, value);
      }
    });
    session.conf().set("spark.sql.parquet.fieldId.read.enabled", "true");
    // The epoch's bounds skip the pages of a row group that lie outside it (Parquet's column index).
    session.conf().set("spark.sql.parquet.filterPushdown", "true");
    return new ParquetFiles(session, withIds, plan, "file".equals(scheme(table)));
  }

  /** The reader of whole row groups, made once. */
  Reader reader() {
    if (unfiltered == null) {
      unfiltered = build(List.of());
    }
    return unfiltered;
  }

  /**
   * The reader of the epoch [lower, upper): its bounds (and regions) go to Parquet as a filter, so that
   * row groups and pages outside it are skipped by their statistics. Rows are still filtered one by
   * one after, as a page holds rows on both sides of a bound.
   */
  Reader reader(long lower, long upper) {
    String ts = Rows.METADATA + "." + Rows.INGESTION_TS;
    List<Filter> filters = new ArrayList<>();
    filters.add(new GreaterThanOrEqual(ts, Instant.EPOCH.plus(lower, ChronoUnit.MICROS)));
    filters.add(new LessThan(ts, Instant.EPOCH.plus(upper, ChronoUnit.MICROS)));
    if (plan.regions != null) {
      filters.add(new In(Rows.METADATA + "." + Rows.CLUSTER, plan.regions.toArray()));
    }
    return build(filters);
  }

  private Reader build(List<Filter> filters) {
    Map<String, String> options = new HashMap<>();
    options.put("returning_batch", "false");  // rows, as the epoch filter reads them
    // Iceberg writes proleptic Gregorian dates and times, and no Spark version that would say so.
    options.put("datetimeRebaseMode", "CORRECTED");
    options.put("int96RebaseMode", "CORRECTED");
    return new Reader(new ParquetFileFormat().buildReaderWithPartitionValues(
        session, schema, new StructType(), schema, CollectionConverters.asScala(filters).toSeq(),
        scala.collection.immutable.Map.from(CollectionConverters.asScala(options)), hadoop));
  }

  private static String refusal(Table table, Plan plan) {
    if (table.properties().containsKey(TableProperties.DEFAULT_NAME_MAPPING)) {
      return "it has a name mapping (files without field ids)";
    }
    String scheme = scheme(table);
    try {
      FileSystem.getFileSystemClass(scheme, SparkSession.active().sessionState().newHadoopConf());
    } catch (IOException | RuntimeException e) {
      return "Hadoop has no FileSystem for " + scheme + "://";
    }
    return null;
  }

  /** The scheme of the table's location, "file" where it names none. */
  private static String scheme(Table table) {
    String location = table.location();
    int colon = location.indexOf(':');
    return colon > 0 ? location.substring(0, colon) : "file";
  }

  private static Schema schemaOf(Table table, Plan plan) {
    Snapshot snapshot = plan.snapshotId == null ? null : table.snapshot(plan.snapshotId);
    Integer id = snapshot == null ? null : snapshot.schemaId();
    Schema schema = id == null ? null : table.schemas().get(id);
    return schema != null ? schema : table.schema();
  }

  /** `type` with each struct field's Iceberg field id in its metadata; null for a type left to Iceberg. */
  private static DataType withFieldIds(DataType type, Type iceberg) {
    if (type instanceof StructType struct && iceberg instanceof Types.StructType fields) {
      StructField[] out = new StructField[struct.fields().length];
      for (int i = 0; i < out.length; i++) {
        StructField field = struct.fields()[i];
        Types.NestedField match = fields.field(field.name());
        DataType inner = match == null ? null : withFieldIds(field.dataType(), match.type());
        if (inner == null) {
          return null;
        }
        Metadata metadata =
            new MetadataBuilder().withMetadata(field.metadata()).putLong(FIELD_ID, match.fieldId()).build();
        out[i] = new StructField(field.name(), inner, field.nullable(), metadata);
      }
      return new StructType(out);
    }
    if (type instanceof ArrayType array && iceberg instanceof Types.ListType list) {
      DataType element = withFieldIds(array.elementType(), list.elementType());
      return element == null ? null : new ArrayType(element, array.containsNull());
    }
    if (type instanceof MapType map && iceberg instanceof Types.MapType pairs) {
      DataType key = withFieldIds(map.keyType(), pairs.keyType());
      DataType value = withFieldIds(map.valueType(), pairs.valueType());
      return key == null || value == null ? null : new MapType(key, value, map.valueContainsNull());
    }
    return switch (iceberg.typeId()) {
      case BOOLEAN, INTEGER, LONG, FLOAT, DOUBLE, DATE, TIMESTAMP, STRING, BINARY, DECIMAL -> type;
      default -> null;  // time, uuid, fixed, variant, ...: Spark reads them as other types
    };
  }

  /** The slices of a split's files, or null when one of them is to be read by Iceberg's reader. */
  static Slice[] slices(List<FileScanTask> tasks) {
    Slice[] slices = new Slice[tasks.size()];
    for (int i = 0; i < slices.length; i++) {
      FileScanTask task = tasks.get(i);
      if (task.file().format() != FileFormat.PARQUET || !task.deletes().isEmpty()) {
        return null;
      }
      slices[i] = new Slice(task.file().location(), task.start(), task.length(), task.file().fileSizeInBytes());
    }
    return slices;
  }

  /**
   * An epoch's slices packed into about `tasks` groups of similar size, each read by one task:
   * neighbouring slices of a file join into one (its footer read once), cut where a group would
   * grow past its share, and the pieces go largest first to the least-loaded group. A small table gets
   * as many tasks as a large one: the tables of a backfill are read in one stage, each table's tasks
   * after the previous table's, so a table's epoch read by one task would keep one core busy at the
   * end of the stage while the others wait.
   */
  static List<Slice[]> pack(List<Slice> slices, int tasks) {
    List<Slice> sorted = new ArrayList<>(slices);
    sorted.sort(Comparator.comparing(Slice::path).thenComparingLong(Slice::start));
    long total = 0;
    for (Slice slice : sorted) {
      total += slice.length();
    }
    long share = (total + tasks - 1) / Math.max(1, tasks);
    List<Slice> pieces = new ArrayList<>();
    Slice run = null;
    for (Slice slice : sorted) {
      if (run != null && run.path().equals(slice.path()) && run.end() == slice.start()
          && run.length() + slice.length() <= share) {
        run = new Slice(run.path(), run.start(), run.length() + slice.length(), run.fileSize());
      } else {
        if (run != null) {
          pieces.add(run);
        }
        run = slice;
      }
    }
    if (run != null) {
      pieces.add(run);
    }
    pieces.sort(Comparator.comparingLong(Slice::length).reversed());
    int groups = Math.max(1, Math.min(tasks, pieces.size()));
    List<List<Slice>> packed = new ArrayList<>();
    long[] loads = new long[groups];
    for (int i = 0; i < groups; i++) {
      packed.add(new ArrayList<>());
    }
    for (Slice piece : pieces) {
      int least = 0;
      for (int i = 1; i < groups; i++) {
        if (loads[i] < loads[least]) {
          least = i;
        }
      }
      packed.get(least).add(piece);
      loads[least] += piece.length();
    }
    List<Slice[]> out = new ArrayList<>();
    for (List<Slice> group : packed) {
      if (!group.isEmpty()) {
        group.sort(Comparator.comparing(Slice::path).thenComparingLong(Slice::start));
        out.add(group.toArray(new Slice[0]));
      }
    }
    return out;
  }

  /** Spark's Parquet reader of one epoch's slices, sent to the tasks that read them. */
  static final class Reader implements Serializable {
    private static final long serialVersionUID = 1L;

    private final Function1<PartitionedFile, Iterator<InternalRow>> read;

    private Reader(Function1<PartitionedFile, Iterator<InternalRow>> read) {
      this.read = read;
    }

    /** The rows of `slices`, one file after another. */
    PartitionReader<InternalRow> open(Slice[] slices) {
      return new PartitionReader<>() {
        private int next = 0;
        private Iterator<InternalRow> rows = null;
        private InternalRow current = null;

        @Override
        public boolean next() throws IOException {
          while (rows == null || !rows.hasNext()) {
            closeRows();
            if (next == slices.length) {
              return false;
            }
            Slice slice = slices[next++];
            PartitionedFile file = new PartitionedFile(
                InternalRow.empty(), SparkPath.fromPath(new Path(slice.path())), slice.start(), slice.length(),
                new String[0], 0L, slice.fileSize(), scala.collection.immutable.Map$.MODULE$.<String, Object>empty());
            rows = read.apply(file);
          }
          current = rows.next();
          return true;
        }

        @Override
        public InternalRow get() {
          return current;
        }

        private void closeRows() throws IOException {
          if (rows instanceof Closeable closeable) {
            closeable.close();
          }
          rows = null;
        }

        @Override
        public void close() throws IOException {
          closeRows();
        }
      };
    }
  }
}
