"""How the project's errors raised inside Spark tasks keep their kind when they reach the driver."""

from __future__ import annotations

from kafka_batch.errors import DataLossError, ServiceError, one_line, raised_in_task

# The text of the exception the driver gets when a reader's task raised (as logged by a chaos run).
WORKER_TRACEBACK = """An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/tmp/spark-1/userFiles-2/kafka_batch.zip/kafka_batch/kafka/source.py", line 253, in _raise_read_error
    raise DataLossError(f"{where}: offset out of range, records were deleted before they were read ({error.str()})")
kafka_batch.errors.DataLossError: t[2] range 1775..3544 at offset 1775: offset out of range, records were deleted\
 before they were read (Broker: Offset out of range (broker 1))
"""


def test_a_tasks_data_loss_is_data_loss_on_the_driver():
    error = raised_in_task(RuntimeError(WORKER_TRACEBACK))
    assert isinstance(error, DataLossError) and error.exit_code == 5 and not error.retryable
    assert str(error) == ("t[2] range 1775..3544 at offset 1775: offset out of range, records were deleted before"
                          " they were read (Broker: Offset out of range (broker 1))")
    assert one_line(error).startswith("kafka-batch: data loss: t[2] range 1775..3544")


def test_spark_connects_sqlstate_suffix_is_dropped_and_other_errors_stay_as_they_are():
    connect = "kafka_batch.errors.ServiceError: t[0] range 0..10: no progress for 120s SQLSTATE: 38000"
    error = raised_in_task(RuntimeError(connect))
    assert isinstance(error, ServiceError) and str(error) == "t[0] range 0..10: no progress for 120s"
    assert raised_in_task(RuntimeError("java.lang.OutOfMemoryError: Java heap space")) is None
    assert raised_in_task(RuntimeError("mymodule.errors.DataLossError: not ours")) is None


def test_an_unsafe_broker_is_its_own_kind_never_retried():
    from kafka_batch.errors import UnsafeBroker, from_exit_code

    error = from_exit_code(6, "batch 3 reads nothing and commits nothing: ...")
    assert isinstance(error, UnsafeBroker) and not error.retryable
    assert one_line(error) == "kafka-batch: unsafe broker: batch 3 reads nothing and commits nothing: ..."
