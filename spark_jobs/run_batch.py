"""spark-submit entry point: execute one planned batch. The logic lives in kafka_batch.spark.job."""

import logging
import os
import sys

from kafka_batch.spark.job import main

if __name__ == "__main__":
    code = main()
    # Committed, or the error recorded, and every connection closed. The interpreter's own exit would
    # now unload pyspark, pyarrow and pandas for 0.15 s before spark-submit's JVM can stop.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
