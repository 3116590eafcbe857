"""pyspark's Python worker daemon, with the libraries of a read task imported before it forks workers.

A Spark server forks a Python worker from its daemon per concurrent task and kills a worker idle for a
minute (a fixed minute in Spark 4.2), so a batch every few minutes always starts on fresh workers. A
fresh worker of pyspark's own daemon imports pyspark's worker, pyarrow, numpy, confluent-kafka, and
pandas (pyarrow imports it the first time it converts Python values), and fastavro or protobuf for
those formats, before it reads a record: 0.6-0.7 s of every such batch on a 2-core machine. Forked from
this daemon, a worker finds them imported (tests/unit/test_spark_daemon.py holds the list complete).

Set it on a long-lived server (`kafka-batch local up` does; docker-compose.yml too):
    --conf spark.python.daemon.module=kafka_batch_daemon.preloaded
It imports nothing of kafka_batch (see the package's docstring): only libraries, whose versions are the
server environment's in any case. pyspark's daemon imports the worker after each fork because a
library may start threads at import; these hold fork-safe ones (OpenBLAS's pool and jemalloc's
background thread shut down or restart around a fork).
"""

import confluent_kafka  # noqa: F401
import confluent_kafka.admin  # noqa: F401
import fastavro  # noqa: F401 - Avro reads
import google.protobuf.descriptor_pb2  # noqa: F401 - Protobuf reads
import google.protobuf.descriptor_pool  # noqa: F401
import google.protobuf.message_factory  # noqa: F401
import numpy  # noqa: F401
import pandas  # noqa: F401
import pyarrow  # noqa: F401
import pyarrow.compute  # noqa: F401
import pyarrow.json  # noqa: F401
import pyarrow.pandas_compat  # noqa: F401 - imported by pyarrow's first conversion of Python values
import pyarrow.vendored.version  # noqa: F401
import pyspark.worker  # noqa: F401
from pyspark import daemon

if __name__ == "__main__":
    daemon.manager()
