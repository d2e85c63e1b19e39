"""A foreachBatch function's failure reaches its query's owner with its reason, even when the query is being
stopped (a router's SIGTERM while a commit fails): Spark's stream thread reads the error's text with a
regular expression that overflows its stack on a Java stack trace, and then ends the query with no error."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bergstream.query import BatchFailed, causes_text, foreach_batch, query_failure

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SPARK_REPORT = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
    "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach batch "
    "sink. Reason: An exception was raised by the Python Proxy. Return Message: "
    "Traceback (most recent call last):\n"
    '  File "archiver.py", line 6, in batch\n    raise KeyError("b")\nKeyError: \'b\'\n\n'
    "The above exception was the direct cause of the following exception:\n\n"
    "Traceback (most recent call last):\n"
    '  File "py4j/clientserver.py", line 644, in _call_proxy\n'
    "    return_value = getattr(self.pool[obj_id], method)(*params)\n"
    "bergstream.query.BatchFailed: q batch 3 failed: java.sql.SQLException: gone\n"
    "second line of the message\n SQLSTATE: 39000\n=== Streaming Query ===\nIdentifier: [id = 1, runId = 2]\n"
)


def test_the_reason_of_a_failed_batch_is_the_python_error_s_own_line_the_last_of_its_chain() -> None:
    assert query_failure(Exception(SPARK_REPORT)) == (
        "bergstream.query.BatchFailed: q batch 3 failed: java.sql.SQLException: gone"
    )
    assert (
        query_failure(Exception("[STREAM_FAILED] no Python here\nmore")) == "[STREAM_FAILED] no Python here"
    )


def test_the_causes_of_a_python_chain_are_one_line_each_and_bounded() -> None:
    try:
        try:
            raise KeyError("x" * 10_000)
        except KeyError as inner:
            raise ValueError("the catalog\nis gone") from inner
    except ValueError as error:
        text = causes_text(error)
    assert text.startswith("ValueError: the catalog; caused by KeyError: 'xxx")
    assert len(text) <= 4000 and "\n" not in text


def _long_java_failure(spark: SparkSession) -> None:
    """A Java call that fails with a Py4JJavaError carrying several thousand characters."""
    jvm: Any = spark._jvm
    jvm.java.lang.Class.forName("no.such.Class" + "x" * 6000)


@pytest.mark.integration
@pytest.mark.parametrize("boundary", [True, False], ids=["bergstream", "plain"])
def test_a_batch_that_fails_in_java_while_its_query_stops_still_fails_the_query_with_its_reason(
    spark: SparkSession, tmp_path: Path, boundary: bool
) -> None:
    """The batch fails only once the query's stop has begun (the router's SIGTERM during a commit). With
    the function as Spark's plain foreachBatch takes it, Spark loses the error (the plain case shows this
    machine's Spark still does); through `foreach_batch`, the query ends with it."""
    inside = threading.Event()
    queries: list[Any] = []

    def batch(records: DataFrame, batch_id: int) -> None:
        inside.set()
        while queries[0].isActive:  # until query.stop() has marked the query terminated
            threading.Event().wait(0.05)
        _long_java_failure(spark)

    function = foreach_batch("bergstream-test-stop", batch) if boundary else batch
    frame = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
    query = (
        frame.writeStream.foreachBatch(function)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    queries.append(query)
    assert inside.wait(60), "no batch started"
    query.stop()
    error = query.exception()
    if not boundary:
        assert error is None, "Spark now reports a failure during stop: foreach_batch may no longer be needed"
        return
    assert error is not None, "the batch's failure was lost"
    reason = query_failure(error)
    assert reason.startswith(f"{BatchFailed.__module__}.BatchFailed: bergstream-test-stop batch "), reason
    assert "java.lang.ClassNotFoundException: no.such.Class" in reason
    assert len(str(error)) < 10_000


@pytest.mark.integration
def test_a_python_error_of_a_batch_crosses_unchanged(spark: SparkSession, tmp_path: Path) -> None:
    def batch(records: DataFrame, batch_id: int) -> None:
        raise LookupError(f"batch {batch_id} has no topic")

    frame = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
    query = (
        frame.writeStream.foreachBatch(foreach_batch("bergstream-test-python", batch))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    with pytest.raises(Exception) as raised:
        query.awaitTermination(60)
    assert query_failure(raised.value) == "LookupError: batch 0 has no topic"
