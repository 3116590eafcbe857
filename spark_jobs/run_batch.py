"""spark-submit entry point: execute one planned batch. The logic lives in kafka_batch.spark.job."""

import sys

from kafka_batch.spark.job import main

if __name__ == "__main__":
    sys.exit(main())
