package io.bergstream.router;

import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URI;
import org.apache.hadoop.fs.Path;
import org.apache.iceberg.Files;
import org.apache.iceberg.hadoop.HadoopFileIO;
import org.apache.iceberg.io.InputFile;
import org.apache.iceberg.io.OutputFile;
import org.apache.iceberg.io.PositionOutputStream;

/**
 * Iceberg's HadoopFileIO, whose files of a local warehouse ({@code file:} locations) are created through
 * java.io instead of Hadoop's local file system: without Hadoop's native library, that one sets the
 * permissions of every file and directory it creates by running {@code chmod}, a process started for each
 * data, manifest and metadata file and for the checksum file beside each. Reads, deletes and listings stay
 * Hadoop's; a file is recorded under the location it was asked for, as HadoopFileIO records it. Set as
 * the catalog's {@code io-impl} for a warehouse on a local file system (bergstream.catalog).
 */
public class LocalFileIO extends HadoopFileIO {
  private static final long serialVersionUID = 1L;

  public LocalFileIO() {}

  @Override
  public OutputFile newOutputFile(String location) {
    File file = localFile(location);
    return file == null ? super.newOutputFile(location) : new LocalOutput(location, file, this);
  }

  /** The file of a {@code file:} location; null for any other scheme, or none (the default file system's). */
  static File localFile(String location) {
    URI uri = new Path(location).toUri();
    return "file".equals(uri.getScheme()) ? new File(uri.getPath()) : null;
  }

  /** A new local file, created as Iceberg creates local files; its location the one asked for. */
  private static final class LocalOutput implements OutputFile {
    private final String location;
    private final File file;
    private final LocalFileIO io;

    LocalOutput(String location, File file, LocalFileIO io) {
      this.location = location;
      this.file = file;
      this.io = io;
    }

    @Override
    public PositionOutputStream create() {
      directory();
      return Files.localOutput(file).create();
    }

    @Override
    public PositionOutputStream createOrOverwrite() {
      directory();
      return Files.localOutput(file).createOrOverwrite();
    }

    /** The file's directory, made if missing: tasks writing files of one new hour make it side by side. */
    private void directory() {
      try {
        java.nio.file.Files.createDirectories(file.toPath().getParent());
      } catch (IOException error) {
        throw new UncheckedIOException("making the directory of " + location, error);
      }
    }

    @Override
    public String location() {
      return location;
    }

    @Override
    public InputFile toInputFile() {
      return io.newInputFile(location);
    }

    @Override
    public String toString() {
      return location;
    }
  }
}
