package io.bergstream.backfill;

import static io.bergstream.backfill.Plans.HOUR;
import static io.bergstream.backfill.Plans.START;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.junit.jupiter.api.Test;

/** A backfill's plan as the Java source reads it: its epochs, its watermark, and which splits an epoch needs. */
class PlanTest {
  private static String plan(String epochs) {
    return "{\"format\":1,\"table\":\"t\",\"window\":[" + START + "," + (START + 4 * HOUR) + "],\"epochs\":" + epochs + "}";
  }

  private static String epoch(long lower, long upper) {
    return "[" + lower + "," + upper + "]";
  }

  @Test
  void epochsEmptyOutOfOrderOrOutsideTheWindowAreRefused() {
    for (String epochs : List.of(
        "[" + epoch(START, START) + "]",
        "[" + epoch(START + HOUR, START) + "]",
        "[" + epoch(START + HOUR, START + 2 * HOUR) + "," + epoch(START, START + HOUR) + "]",
        "[" + epoch(START, START + 2 * HOUR) + "," + epoch(START + HOUR, START + 3 * HOUR) + "]",
        "[" + epoch(START - 1, START + HOUR) + "]",
        "[" + epoch(START, START + 4 * HOUR + 1) + "]")) {
      assertThrows(IllegalArgumentException.class, () -> Plans.of(plan(epochs)), epochs);
    }
    Plan gaps = Plans.of(plan("[" + epoch(START, START + HOUR) + "," + epoch(START + 2 * HOUR, START + 4 * HOUR) + "]"));
    assertEquals(2, gaps.size());
  }

  @Test
  void theWatermarkIsTheWindowsStartThenTheUpperBoundOfTheLastEpochDone() {
    Plan plan = Plans.hours(4);
    assertEquals(START, plan.watermark(0));
    for (int done = 1; done <= 4; done++) {
      assertEquals(START + done * HOUR, plan.watermark(done));
    }
  }

  /** A row of a generated layout: its file, the byte position of its row group, its ingestion time. */
  private record Row(String file, long position, long time) {}

  /**
   * Generated layouts of files and row groups, epochs of width B, and Iceberg's splits at arbitrary byte
   * ranges: reading each epoch's kept splits, and of them the rows of the epoch, reads every row once, and
   * no row after one ingested more than B later.
   */
  @Test
  void splitsKeptForEachEpochReadEveryRowOnceNeverOneMoreThanBAfterALaterOne() {
    Random random = new Random(11);
    long width = 15 * 60_000_000L;
    for (int layout = 0; layout < 200; layout++) {
      int epochCount = 1 + random.nextInt(12);
      long end = START + epochCount * width;
      List<Row> rows = new ArrayList<>();
      StringBuilder groups = new StringBuilder();
      StringBuilder files = new StringBuilder();
      Map<String, Long> sizes = new HashMap<>();
      int fileCount = 1 + random.nextInt(6);
      for (int f = 0; f < fileCount; f++) {
        String file = "s3://archive/data/f" + f + ".parquet";
        long position = 4;
        long fileMin = Long.MAX_VALUE;
        long fileMax = Long.MIN_VALUE;
        StringBuilder fileGroups = new StringBuilder();
        int groupCount = 1 + random.nextInt(5);
        for (int g = 0; g < groupCount; g++) {
          long size = 1 + random.nextInt(1_000);
          long midpoint = position + size / 2;
          long min = Long.MAX_VALUE;
          long max = Long.MIN_VALUE;
          for (int r = 0; r < 1 + random.nextInt(20); r++) {
            long time = START + (long) (random.nextDouble() * (end - START));
            rows.add(new Row(file, midpoint, time));
            min = Math.min(min, time);
            max = Math.max(max, time);
          }
          fileGroups.append(g == 0 ? "" : ",").append("[").append(midpoint).append(",").append(min).append(",")
              .append(max).append("]");
          fileMin = Math.min(fileMin, min);
          fileMax = Math.max(fileMax, max);
          position += size;
        }
        sizes.put(file, position);
        // Some files' row groups are known, some only their bounds.
        if (random.nextBoolean()) {
          groups.append(groups.length() == 0 ? "" : ",").append("\"").append(file).append("\":[").append(fileGroups)
              .append("]");
        }
        files.append(files.length() == 0 ? "" : ",").append("\"").append(file).append("\":[").append(fileMin)
            .append(",").append(fileMax).append("]");
      }
      StringBuilder epochs = new StringBuilder();
      for (int e = 0; e < epochCount; e++) {
        epochs.append(e == 0 ? "" : ",").append(epoch(START + e * width, START + (e + 1) * width));
      }
      Plan plan = Plans.of("{\"format\":1,\"table\":\"t\",\"window\":[" + START + "," + end + "],\"epochs\":[" + epochs
          + "],\"row_groups\":{" + groups + "},\"files\":{" + files + "}}");
      // Iceberg's splits of each file: consecutive byte ranges of arbitrary lengths.
      Map<String, List<long[]>> splits = new HashMap<>();
      sizes.forEach((file, size) -> {
        List<long[]> ranges = new ArrayList<>();
        for (long start = 0; start < size; ) {
          long length = 1 + random.nextInt(1_500);
          ranges.add(new long[] {start, length});
          start += length;
        }
        splits.put(file, ranges);
      });
      List<Row> read = new ArrayList<>();
      for (int e = 0; e < plan.size(); e++) {
        long lower = plan.epochs[e][0];
        long upper = plan.epochs[e][1];
        for (Map.Entry<String, List<long[]>> file : splits.entrySet()) {
          for (long[] split : file.getValue()) {
            if (!plan.mayHold(file.getKey(), split[0], split[1], lower, upper)) {
              continue;
            }
            for (Row row : rows) {
              if (row.file().equals(file.getKey()) && row.position() >= split[0] && row.position() < split[0] + split[1]
                  && row.time() >= lower && row.time() < upper) {
                read.add(row);
              }
            }
          }
        }
      }
      assertEquals(rows.size(), read.size(), "layout " + layout + ": rows read once each");
      assertTrue(read.containsAll(rows), "layout " + layout);
      long latest = Long.MIN_VALUE;
      for (Row row : read) {
        latest = Math.max(latest, row.time());
        assertTrue(latest - row.time() < width, "layout " + layout + ": a row read " + (latest - row.time())
            + " microseconds after a later one");
      }
    }
  }

  @Test
  void aSplitWhoseRowGroupsAllLieOutsideTheEpochIsNotRead() {
    Plan plan = Plans.hours(4, ",\"row_groups\":{\"a\":[[100," + START + "," + (START + 10) + "],[300,"
        + (START + 2 * HOUR) + "," + (START + 2 * HOUR + 10) + "]]},\"files\":{\"b\":[" + (START + 3 * HOUR) + ","
        + (START + 3 * HOUR + 5) + "]}");
    assertTrue(plan.mayHold("a", 0, 200, START, START + HOUR));
    assertFalse(plan.mayHold("a", 0, 200, START + HOUR, START + 2 * HOUR));
    assertTrue(plan.mayHold("a", 200, 200, START + 2 * HOUR, START + 3 * HOUR));
    // A split holding no row group's midpoint reads nothing of its own: kept, as Iceberg decides.
    assertTrue(plan.mayHold("a", 400, 100, START, START + HOUR));
    assertFalse(plan.mayHold("b", 0, 100, START, START + 3 * HOUR));
    assertTrue(plan.mayHold("b", 0, 100, START + 3 * HOUR, START + 4 * HOUR));
    assertTrue(plan.mayHold("unknown", 0, 100, START, START + HOUR));
  }
}
