"""The files a run keeps beside its query's checkpoint, and the checkpoint's own logs, read and written
through Hadoop's FileSystem, as Spark keeps the checkpoint: a checkpoint on S3, HDFS or any file system
Spark's Hadoop configuration knows has its plan beside it, where the Java source reads it too.

A location without a scheme is resolved as Spark resolves `checkpointLocation`: against `fs.defaultFS`.
"""

from __future__ import annotations

import json
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

    def remove(self) -> bool:
        """The whole checkpoint removed; False when there was none."""
        return bool(self._fs.delete(self._root, True))

    def names(self, relative: str) -> list[str]:
        """The names of the entries of a folder; none when it does not exist."""
        folder = self._path(relative)
        if not self._fs.exists(folder):
            return []
        return [str(status.getPath().getName()) for status in self._fs.listStatus(folder)]


class RowLedger:
    """The rows each committed micro-batch of a backfill read, per source, in a file beside its checkpoint:
    a resumed run counts the rows of the runs before it, and a replayed batch once."""

    def __init__(self, files: CheckpointFiles, path: str) -> None:
        self.files = files
        self.path = path
        self.batches: dict[int, dict[str, int]] = {}
        if files.exists(path):
            loaded = json.loads(files.read_text(path))
            self.batches = {int(batch): dict(rows) for batch, rows in loaded.items()}

    def record(self, batch_id: int, rows: dict[str, int]) -> None:
        self.batches[batch_id] = rows
        counted = {str(batch): counted for batch, counted in sorted(self.batches.items())}
        self.files.write_text(self.path, json.dumps(counted))

    def totals(self, sources: list[str]) -> dict[str, int]:
        return {source: sum(rows.get(source, 0) for rows in self.batches.values()) for source in sources}


def offset_json(offset: Any) -> Any:
    """An offset as a progress event or the offset log holds it (JSON, or parsed already); None when it
    is not JSON."""
    if offset is None:
        return None
    if isinstance(offset, dict):
        return offset
    try:
        return json.loads(offset)
    except (TypeError, ValueError):
        return None


def committed_batches(files: CheckpointFiles) -> list[int]:
    """The micro-batches Spark committed: delivered whole."""
    return sorted(int(name) for name in files.names("commits") if name.isdigit())


def logged_epoch(files: CheckpointFiles, batch: int) -> int | None:
    """The epochs done once `batch` is, from the query's offset log; None for no such batch."""
    logged = f"offsets/{batch}"
    if batch < 0 or not files.exists(logged):
        return None
    epochs = []
    for line in files.read_text(logged).splitlines()[2:]:
        offset = offset_json(line)
        if isinstance(offset, dict) and "epoch" in offset:
            epochs.append(int(offset["epoch"]))
    return min(epochs) if epochs else None


def committed_epoch(files: CheckpointFiles) -> int | None:
    """The epochs done by the newest micro-batch Spark committed; None before the first commit. A batch
    in the offset log but not in the commit log has not been delivered."""
    committed = committed_batches(files)
    return logged_epoch(files, committed[-1]) if committed else None


def logged_watermark(files: CheckpointFiles, batch: int) -> int | None:
    """The event-time watermark (epoch milliseconds) `batch` ran with, from the query's offset log: its rows
    were emitted against it. None for no such batch, or a query with no watermark (Spark logs 0)."""
    logged = f"offsets/{batch}"
    if batch < 0 or not files.exists(logged):
        return None
    lines = files.read_text(logged).splitlines()
    metadata = offset_json(lines[1]) if len(lines) > 1 else None
    watermark = int(metadata.get("batchWatermarkMs", 0)) if isinstance(metadata, dict) else 0
    return watermark or None


def committed_watermark(files: CheckpointFiles) -> int | None:
    """The watermark the newest micro-batch Spark committed ran with; None before the first commit."""
    committed = committed_batches(files)
    return logged_watermark(files, committed[-1]) if committed else None
