package io.bergstream.backfill;

import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.List;
import org.apache.iceberg.FileScanTask;
import org.apache.iceberg.ScanTask;
import org.apache.iceberg.ScanTaskGroup;
import org.apache.spark.sql.connector.read.InputPartition;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Iceberg cuts every file an epoch overlaps into splits at row-group boundaries, and skips a split's
 * row groups by their statistics only once a task has opened the file. An hour file read at B = 15m
 * would schedule all its splits in each of its four epochs; here the splits whose row groups all lie
 * outside the epoch (bounds from the plan) are dropped before any task is made for them.
 */
final class Splits {
  private static final Logger LOG = LoggerFactory.getLogger(Splits.class);
  // Iceberg's input partition is package-private; its task group accessor is public.
  private static final Method TASK_GROUP = taskGroupAccessor();

  private Splits() {}

  private static Method taskGroupAccessor() {
    try {
      Method method =
          Class.forName("org.apache.iceberg.spark.source.SparkInputPartition").getMethod("taskGroup");
      method.setAccessible(true);
      return method;
    } catch (ReflectiveOperationException | RuntimeException e) {
      LOG.warn("bergstream-backfill: every split of an epoch's files is scheduled ({})", e.toString());
      return null;
    }
  }

  /** Whether Iceberg's splits can be looked into: then the window is planned once for all epochs. */
  static boolean visible() {
    return TASK_GROUP != null;
  }

  static InputPartition[] inEpoch(InputPartition[] splits, Plan plan, long lower, long upper) {
    if (TASK_GROUP == null || (plan.rowGroups.isEmpty() && plan.files.isEmpty())) {
      return splits;
    }
    List<InputPartition> kept = new ArrayList<>(splits.length);
    for (InputPartition split : splits) {
      if (mayHold(split, plan, lower, upper)) {
        kept.add(split);
      }
    }
    return kept.toArray(new InputPartition[0]);
  }

  /** The file tasks of an Iceberg split, or null when it holds other tasks or cannot be looked into. */
  static List<FileScanTask> fileTasks(InputPartition split) {
    if (TASK_GROUP == null) {
      return null;
    }
    ScanTaskGroup<?> group;
    try {
      group = (ScanTaskGroup<?>) TASK_GROUP.invoke(split);
    } catch (ReflectiveOperationException | RuntimeException e) {
      return null;
    }
    List<FileScanTask> files = new ArrayList<>();
    for (ScanTask task : group.tasks()) {
      if (!(task instanceof FileScanTask file)) {
        return null;
      }
      files.add(file);
    }
    return files;
  }

  /** Whether a split may hold rows of the epoch: true when it cannot be looked into. */
  private static boolean mayHold(InputPartition split, Plan plan, long lower, long upper) {
    List<FileScanTask> files = fileTasks(split);
    if (files == null) {
      return true;
    }
    for (FileScanTask file : files) {
      if (plan.mayHold(file.file().location(), file.start(), file.length(), lower, upper)) {
        return true;
      }
    }
    return false;
  }
}
