"""The files a run keeps beside its query's checkpoint, and the checkpoint's own logs, read and written
through Hadoop's FileSystem, as Spark keeps the checkpoint: a checkpoint on S3, HDFS or any file system
Spark's Hadoop configuration knows has its plan beside it, where the Java source reads it too.

A location without a scheme is resolved as Spark resolves `checkpointLocation`: against `fs.defaultFS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class CheckpointFiles:
    """The files under one checkpoint location, by their path relative to it."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        jvm: Any = spark._jvm
        # Looked up once: py4j resolves `jvm.org.apache...` a package at a time, and the JVM looks for a
        # class named `org`, `org.apache`, ... in every jar first; a backfill writes a file every batch.
        self._path_class = jvm.org.apache.hadoop.fs.Path
        self._io_utils = jvm.org.apache.commons.io.IOUtils
        self._root = self._path_class(location)
        self._fs = self._root.getFileSystem(spark._jsc.hadoopConfiguration())
        # Written once and handed to the Java source: qualified, so that it finds the same file system.
        self.location = str(self._fs.makeQualified(self._root).toString())

    def _path(self, relative: str) -> Any:
        return self._path_class(self._root, relative)

    def uri(self, relative: str) -> str:
        return str(self._fs.makeQualified(self._path(relative)).toString())

    def exists(self, relative: str) -> bool:
        return bool(self._fs.exists(self._path(relative)))

    def read_text(self, relative: str) -> str:
        stream = self._fs.open(self._path(relative))
        try:
            return str(self._io_utils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write_text(self, relative: str, text: str) -> None:
        """Write the file whole: into a file beside it, then renamed over it."""
        target = self._path(relative)
        written = self._path(f"{relative}.tmp")
        stream = self._fs.create(written, True)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()
        if self._fs.exists(target):
            self._fs.delete(target, False)
        if not self._fs.rename(written, target):
            raise OSError(f"cannot rename {written.toString()} to {target.toString()}")

    def names(self, relative: str) -> list[str]:
        """The names of the entries of a folder; none when it does not exist."""
        folder = self._path(relative)
        if not self._fs.exists(folder):
            return []
        return [str(status.getPath().getName()) for status in self._fs.listStatus(folder)]
