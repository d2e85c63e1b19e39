package io.bergstream.router;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.io.nativeio.NativeIO;
import org.apache.iceberg.hadoop.HadoopFileIO;
import org.apache.iceberg.hadoop.HadoopOutputFile;
import org.apache.iceberg.io.OutputFile;

/**
 * Iceberg's HadoopFileIO, whose new files of a local warehouse ({@code file:} locations) are created by a
 * file system of its own: Hadoop's local one without a {@code .crc} file beside each file, its permissions
 * set through java.nio. Without Hadoop's native library, Hadoop's local file system sets the permissions
 * of every file and directory it creates by running {@code chmod}, a process started for each data,
 * manifest and metadata file and for the checksum file beside each. The files are still Hadoop's output
 * files (Parquet's writer copies their configuration instead of parsing Hadoop's defaults for each), at
 * the same locations; reads, deletes and listings stay HadoopFileIO's. Iceberg's Parquet writer does not
 * use the output file's own file system: it asks Hadoop for the one of the file's path under the file's
 * configuration, so that configuration names this file system for {@code file:}, uncached (Hadoop's cache
 * of file systems is by scheme alone, and holds its local one already). Set as the catalog's
 * {@code io-impl} for a warehouse on a local file system (bergstream.catalog).
 */
public class LocalFileIO extends HadoopFileIO {
  private static final long serialVersionUID = 1L;
  private transient volatile RawLocalFileSystem local;
  private transient volatile Configuration localConf;

  public LocalFileIO() {}

  @Override
  public OutputFile newOutputFile(String location) {
    Path path = new Path(location);
    if (!isLocal(path)) {
      return super.newOutputFile(location);
    }
    RawLocalFileSystem made = local();
    return HadoopOutputFile.fromPath(path, made, localConf);
  }

  /** Whether {@code path} says {@code file:}; one without a scheme is the default file system's. */
  static boolean isLocal(Path path) {
    return "file".equals(path.toUri().getScheme());
  }

  private RawLocalFileSystem local() {
    RawLocalFileSystem made = local;
    if (made == null) {
      synchronized (this) {
        made = local;
        if (made == null) {
          Configuration own = new Configuration(conf());
          own.setClassLoader(PermissionsThroughNio.class.getClassLoader());
          own.set("fs.file.impl", PermissionsThroughNio.class.getName());
          own.setBoolean("fs.file.impl.disable.cache", true);
          made = new PermissionsThroughNio();
          try {
            made.initialize(URI.create("file:///"), own);
          } catch (IOException error) {
            throw new UncheckedIOException("starting the local file system of LocalFileIO", error);
          }
          localConf = own;
          local = made;
        }
      }
    }
    return made;
  }

  /**
   * Hadoop's raw local file system, permissions set as chmod would set them, without starting it. Public, as
   * Hadoop makes the file systems its configuration names.
   */
  public static final class PermissionsThroughNio extends RawLocalFileSystem {
    public PermissionsThroughNio() {}

    @Override
    public void setPermission(Path path, FsPermission permission) throws IOException {
      if (NativeIO.isAvailable()) {
        super.setPermission(path, permission);
        return;
      }
      String symbols = permission.getUserAction().SYMBOL + permission.getGroupAction().SYMBOL
          + permission.getOtherAction().SYMBOL;
      Files.setPosixFilePermissions(pathToFile(path).toPath(), PosixFilePermissions.fromString(symbols));
    }

    @Override
    public void initialize(URI uri, Configuration conf) throws IOException {
      super.initialize(uri, conf);
      setConf(conf);
    }
  }
}
