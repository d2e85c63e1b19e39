package io.bergstream.router;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.bergstream.router.TopicGroups.Part;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.junit.jupiter.api.Test;

/** A batch's job's tasks: each topic's partitions in as many tasks as its records are worth. */
class TopicGroupsTest {
  /** For each task, the topics it reads. */
  static List<Set<String>> topics(List<List<Integer>> groups, List<Part> parts) {
    List<Set<String>> topics = new ArrayList<>();
    for (List<Integer> group : groups) {
      Set<String> own = new HashSet<>();
      group.forEach(index -> own.add(parts.get(index).topic()));
      topics.add(own);
    }
    return topics;
  }

  static long tasksReading(String topic, List<Set<String>> topics) {
    return topics.stream().filter(own -> own.contains(topic)).count();
  }

  @Test
  void aTopicWorthOneTaskIsReadByOneWhateverItsPartitions() {
    List<Part> parts = List.of(new Part("a", 300), new Part("a", 300), new Part("a", 300), new Part("a", 300));
    List<List<Integer>> groups = TopicGroups.groups(parts, 2, Map.of("a", 1));
    assertEquals(List.of(List.of(0, 1, 2, 3)), groups);
  }

  @Test
  void aTopicWorthTwoTasksIsSplitInTwoOfAboutEqualRecords() {
    List<Part> parts =
        List.of(new Part("a", 500), new Part("a", 100), new Part("a", 300), new Part("a", 300));
    List<List<Integer>> groups = TopicGroups.groups(parts, 2, Map.of("a", 2));
    assertEquals(2, groups.size());
    Set<Set<Integer>> split = new HashSet<>();
    groups.forEach(group -> split.add(Set.copyOf(group)));
    assertEquals(Set.of(Set.of(0, 1), Set.of(2, 3)), split);
  }

  @Test
  void topicsNotNamedAreOneTaskEachAndSpreadByRecords() {
    List<Part> parts = new ArrayList<>();
    for (int topic = 0; topic < 10; topic++) {
      for (int partition = 0; partition < 3; partition++) {
        parts.add(new Part("t" + topic, 100 * (topic + 1)));
      }
    }
    List<List<Integer>> groups = TopicGroups.groups(parts, 2, Map.of());
    List<Set<String>> topics = topics(groups, parts);
    for (int topic = 0; topic < 10; topic++) {
      assertEquals(1, tasksReading("t" + topic, topics), "t" + topic);
    }
    long[] records = new long[groups.size()];
    for (int i = 0; i < groups.size(); i++) {
      for (int index : groups.get(i)) {
        records[i] += parts.get(index).records();
      }
    }
    // 16,500 records over two tasks, placed largest topic first: within the smallest topic's share.
    assertEquals(2, records.length);
    assertEquals(16_500, records[0] + records[1]);
    assertEquals(true, Math.abs(records[0] - records[1]) <= 300, java.util.Arrays.toString(records));
  }

  @Test
  void aTopicIsNeverSplitOverMoreTasksThanItHasPartitionsOrTheJobHas() {
    List<Part> parts = List.of(new Part("a", 1000), new Part("a", 1000), new Part("b", 10));
    List<Set<String>> topics = topics(TopicGroups.groups(parts, 2, Map.of("a", 8, "b", 8)), parts);
    assertEquals(2, tasksReading("a", topics));
    assertEquals(1, tasksReading("b", topics));
    List<Set<String>> one = topics(TopicGroups.groups(parts, 1, Map.of("a", 8)), parts);
    assertEquals(List.of(Set.of("a", "b")), one);
  }

  @Test
  void partitionsNotTheKafkaSourcesAreSpreadOneByOne() {
    List<Part> parts = List.of(new Part(null, 1), new Part(null, 1), new Part(null, 1), new Part(null, 1));
    List<List<Integer>> groups = TopicGroups.groups(parts, 2, Map.of());
    assertEquals(2, groups.size());
    assertEquals(2, groups.get(0).size());
    assertEquals(2, groups.get(1).size());
  }

  @Test
  void aBatchOfManySmallReadsIsReadInterpretedOneOfFewOrLargeOnesCompiled() {
    assertTrue(TopicGroups.smallReads(200 * 500L, 200), "100 quiet topics' 200 partitions, 500 records each");
    assertFalse(TopicGroups.smallReads(2 * 50_000L, 2), "one busy topic");
    assertFalse(TopicGroups.smallReads(10, 1), "a single read: its code is generated once either way");
    assertFalse(TopicGroups.smallReads(200L * TopicGroups.SMALL_READ, 200));
    assertTrue(TopicGroups.smallReads(200L * TopicGroups.SMALL_READ - 1, 200));
  }
}
