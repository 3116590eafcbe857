"""Every error the project names, in one place: one base class and a few kinds that say what to do.

The kind decides the exit code of the CLI and of the Spark job, and whether Airflow may retry:
bad input and lost races never get better by retrying; a broker that did not answer may.
"""

from __future__ import annotations

import re


class KafkaBatchError(Exception):
    """A condition the project recognises; the message is one line an operator can act on."""

    exit_code = 1
    retryable = False


class InputError(KafkaBatchError):
    """A pipeline definition, a connection or an operator's request is invalid; nothing was changed."""

    exit_code = 2


class MissingTopic(InputError):
    """A topic the pipeline reads does not exist (yet): for a pipeline that never ran, not started."""


class StateError(KafkaBatchError):
    """The stored state refuses the step: a lost compare-and-set, a stale attempt, a batch in the wrong status."""

    exit_code = 3


class FencedAttempt(StateError):
    """A newer attempt (or a newer plan) owns the batch; this attempt must not commit."""


class ServiceError(KafkaBatchError):
    """Kafka or Postgres refused or did not answer; often transient, so Airflow may retry."""

    exit_code = 4
    retryable = True


class DataLossError(ServiceError):
    """Records a batch needs are no longer in the log (retention overtook them): an operator decides."""

    exit_code = 5
    retryable = False


class UnsafeBroker(KafkaBatchError):
    """The Kafka cluster's transactional check found that its read_committed answers can skip or show
    the wrong records: a batch would move positions past what it did not read. Retrying cannot help."""

    exit_code = 6


# Messages of records a pipeline cannot process start with this (raised inside Spark, found by the job).
INVALID_RECORD = "invalid record"

KINDS = (InputError, StateError, ServiceError, DataLossError, UnsafeBroker)


def from_exit_code(code: int, message: str) -> KafkaBatchError:
    """The error a child process (the Spark job) reported through its exit code."""
    for kind in KINDS:
        if kind.exit_code == code:
            return kind(message)
    return KafkaBatchError(message)


# How a Spark task's exception names one of ours: Spark wraps it in a Python-worker error whose text holds
# the worker's traceback (and, under Spark Connect, a SQLSTATE suffix).
_RAISED_IN_TASK = re.compile(r"^kafka_batch\.errors\.(\w+): (.+)$", re.MULTILINE)


def without_sqlstate(message: str) -> str:
    """A task's error text without the SQLSTATE suffix Spark Connect appends."""
    return re.sub(r"\s*SQLSTATE: \w+$", "", message)


# Where a Spark error's message ends and its traces begin (the query context, the JVM's stack, Python's).
_SPARK_TRACE = re.compile(r"\s*(?:== DataFrame ==|== SQL|JVM stacktrace:|\n\s*at [\w$.]+\(|Traceback \(most recent)")


def without_traces(message: str) -> str:
    """A Spark error's message without the traces that follow it (the log keeps them) or its SQLSTATE."""
    found = _SPARK_TRACE.search(message)
    return re.sub(r"\s*SQLSTATE: \w+", "", message[:found.start()] if found else message).strip()


def raised_in_task(spark_error: BaseException) -> KafkaBatchError | None:
    """The project's error a Spark task raised (e.g. a reader's DataLossError), so that it keeps its kind,
    exit code and message when it reaches the driver; None for anything else."""
    kinds = {kind.__name__: kind for kind in (*KINDS, FencedAttempt, KafkaBatchError)}
    for name, message in reversed(_RAISED_IN_TASK.findall(str(spark_error))):
        if name in kinds:
            return kinds[name](without_sqlstate(message))
    return None


def one_line(exc: BaseException) -> str:
    """`kafka-batch: <kind>: <message>` without a traceback; unknown errors keep their class name."""
    kind = type(exc).__name__ if not isinstance(exc, KafkaBatchError) else _label(exc)
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"kafka-batch: {kind}: {text}"


def _label(exc: KafkaBatchError) -> str:
    for kind, label in ((UnsafeBroker, "unsafe broker"), (DataLossError, "data loss"), (ServiceError, "unavailable"),
                        (StateError, "refused"), (InputError, "invalid input")):
        if isinstance(exc, kind):
            return label
    return "error"
