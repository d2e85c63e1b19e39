package io.bergstream.router;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.iceberg.exceptions.AlreadyExistsException;
import org.apache.iceberg.hadoop.HadoopOutputFile;
import org.apache.iceberg.io.OutputFile;
import org.apache.iceberg.io.PositionOutputStream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** A local warehouse's files made through java.io: where and as HadoopFileIO would make them, no chmod. */
class LocalFileIOTest {
  @TempDir Path warehouse;

  LocalFileIO io() {
    LocalFileIO io = new LocalFileIO();
    io.setConf(new Configuration());
    io.initialize(Map.of());
    return io;
  }

  @Test
  void aFileIsMadeInItsNewDirectoryKeepsItsLocationAndIsReadBackByHadoop() throws Exception {
    LocalFileIO io = io();
    String location = "file:" + warehouse + "/table/data/hour=1/part-0.parquet";
    OutputFile output = io.newOutputFile(location);
    assertEquals(location, output.location(), "recorded as asked, scheme and all");
    try (PositionOutputStream stream = output.create()) {
      stream.write("rows".getBytes(StandardCharsets.UTF_8));
      assertEquals(4, stream.getPos());
    }
    Path file = warehouse.resolve("table/data/hour=1/part-0.parquet");
    assertEquals("rows", Files.readString(file));
    assertFalse(Files.exists(file.resolveSibling(".part-0.parquet.crc")), "no checksum file beside it");
    assertEquals("rw-r--r--", PosixFilePermissions.toString(Files.getPosixFilePermissions(file)),
        "the permissions Hadoop gives a new file, without a chmod process");
    assertEquals("HadoopOutputFile", output.getClass().getSimpleName(), "Parquet copies its configuration");
    assertEquals(4, output.toInputFile().getLength());
    try (InputStream in = io.newInputFile(location).newStream()) {
      assertArrayEquals("rows".getBytes(StandardCharsets.UTF_8), in.readAllBytes());
    }
    assertThrows(AlreadyExistsException.class, () -> io.newOutputFile(location).create());
    try (PositionOutputStream stream = io.newOutputFile(location).createOrOverwrite()) {
      stream.write('!');
    }
    assertEquals("!", Files.readString(file));
    io.deleteFile(location);
    assertFalse(Files.exists(file));
  }

  @Test
  void parquetsWayToAFileOfItsPathMakesItWithoutChmodOrChecksum() throws Exception {
    // Iceberg's Parquet writer opens a Hadoop output file by its path and configuration alone
    // (org.apache.parquet.hadoop.util.HadoopOutputFile.fromPath(path, conf)): Hadoop's file system for it.
    String location = "file:" + warehouse + "/t/data/part-0.parquet";
    HadoopOutputFile output = (HadoopOutputFile) io().newOutputFile(location);
    FileSystem fileSystem = output.getPath().getFileSystem(output.getConf());
    assertEquals(LocalFileIO.PermissionsThroughNio.class, fileSystem.getClass());
    try (FSDataOutputStream stream = fileSystem.create(output.getPath(), false)) {
      stream.write(1);
    }
    Path file = warehouse.resolve("t/data/part-0.parquet");
    assertEquals(1, Files.size(file));
    assertFalse(Files.exists(file.resolveSibling(".part-0.parquet.crc")), "no checksum file beside it");
    // Other paths of the JVM keep Hadoop's local file system, from its cache.
    FileSystem others = new org.apache.hadoop.fs.Path("file:" + warehouse).getFileSystem(new Configuration());
    assertEquals(LocalFileSystem.class, others.getClass());
  }

  @Test
  void tasksMakingFilesOfOneNewDirectorySideBySideAllSucceed() throws Exception {
    LocalFileIO io = io();
    ExecutorService pool = Executors.newFixedThreadPool(8);
    try {
      List<Future<?>> made = new ArrayList<>();
      for (int i = 0; i < 64; i++) {
        String location = "file://" + warehouse + "/t/data/hour=" + (i % 4) + "/part-" + i + ".parquet";
        made.add(pool.submit(() -> {
          try (PositionOutputStream stream = io.newOutputFile(location).create()) {
            stream.write(1);
          }
          return null;
        }));
      }
      for (Future<?> future : made) {
        future.get();
      }
    } finally {
      pool.shutdown();
    }
    try (var files = Files.walk(warehouse.resolve("t/data"))) {
      assertEquals(64, files.filter(Files::isRegularFile).count());
    }
  }

  @Test
  void aLocationOfAnotherFileSystemIsLeftToHadoop() throws Exception {
    assertTrue(LocalFileIO.isLocal(new org.apache.hadoop.fs.Path("file:/w/t/f.parquet")));
    assertFalse(LocalFileIO.isLocal(new org.apache.hadoop.fs.Path("s3://bucket/w/t/f.parquet")));
    assertFalse(LocalFileIO.isLocal(new org.apache.hadoop.fs.Path("hdfs://nn/w/t/f.parquet")));
    assertFalse(LocalFileIO.isLocal(new org.apache.hadoop.fs.Path("/w/t/f.parquet")),
        "the default file system's, whichever it is");
    // Without a scheme, Hadoop's own file system makes it: here the default, the local one, with a .crc.
    try (PositionOutputStream stream = io().newOutputFile(warehouse + "/f").create()) {
      stream.write(1);
    }
    assertTrue(Files.exists(warehouse.resolve(".f.crc")));
  }
}
