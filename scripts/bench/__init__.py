"""`make bench`: the project against a hand-written consumer, side by side on the same topic data.

Every batch runs as a user runs it, `kafka-batch run`, timed from the command's start. One run
produces the data, plans every batch, then measures (each with the load average then):
  raw read        a plain confluent-kafka loop over the big batch's ranges, one process, no parsing
  project reader  kafka_source.read_partitions + Arrow columns + JSON fields, as a Spark task does it, one process
  plain consumer  what a user would write (peers/plain_consumer.py): consume, json.loads, a dict aggregate,
                  one CAS commit; its whole process on the small batch's records and on the big one's
  spark small/big the pipeline on a topic of SMALL (1M) and one of RECORDS (3M), in both modes (Spark Connect, the
                  samples' default, and spark-submit); marginal rate, and the batch size from which
                  spark-submit reads 1.5x the plain consumer's rate (Spark Connect warmed first: WARM_UP_BATCHES
                  unmeasured batches, as a long-lived server has run)
  many partitions MANY x (100k/MANY) records against 4 x 25,000 (same 100k records), Spark job wall time
  fixed cost      a 1,000-record batch, with the phases of its timings, against the plain consumer's whole
                  process over the same records; on Spark Connect also after a minute idle (Spark has then
                  killed its Python workers)
  airflow         the same batch as an Airflow DAG run (Airflow started here on the bench's pipelines, its
                  scheduler and LocalExecutor), on Spark Connect and through spark-submit by turns: the
                  execute task's duration, and the whole run's
  kafka-sink      the small size's records published to a topic by a pipeline's Kafka sink, against a plain
                  consume-transform-produce loop committing a transaction every 10,000 records, on the same
                  messages: the loop adding the sink's lineage headers, and the sink without them against the
                  loop without; and one batch of --publish-big (10M) records, the driver's peak memory
                  against the small size's
  metrics         a 1,000-record batch with Airflow's StatsD metrics on, sent to a listening socket and to a
                  backend that is down (a host that does not resolve), the same with OpenTelemetry (an
                  OTLP receiver, a closed port), against the same with metrics off
  commit          commit_batch of 100k distinct aggregate contribution rows
  many keys       records over about as many (user, minute) keys: the job via Spark Connect and spark-submit
                  against the plain consumer aggregating the same, and the commit of that many contribution rows
                  (each key in one range, and each in two)
  upsert          an upsert pipeline over UPSERT_RECORDS records of UPSERT_KEYS customers (5% tombstones),
                  via spark-submit and via Spark Connect, against a plain consumer that upserts each
                  consumed chunk with execute_values (the Kafka Connect JDBC sink's way); the commit of
                  100k changed keys; the history table's size per million records
  avro            AVRO_RECORDS (3M) and SMALL (1M) Avro page views (two schema versions, through the Schema
                  Registry), a topic each: the job (Spark Connect warmed up first) against a plain consumer
                  decoding with AvroDeserializer
  after abort     AFTER_ABORT_RECORDS records committed by a transactional producer that aborted once before
                  the position, against the same from one that never aborted: a batch of each via Spark Connect
  contributions   the size of the per-range contributions table per million records read
  planning        plan_batch over the MANY partitions
  peak RSS, CPU   of every job and peer: the CPU seconds of its command's processes (exactly, from the
                  kernel's account of reaped children) and of the Spark Connect server's, per million records
                  (the table's CPU column, the chart's second panel), with the broker's and Postgres' beside;
                  peak RSS and CPU by process (driver, JVM, Python workers, broker, Postgres) sampled every
                  0.1 s (sampling.py)
  peers           what users would pick instead (peers/), on the same topics, each checked to give the
                  pipeline's rows or messages: Spark's Kafka batch source, an AvailableNow stream, KafkaRDD and
                  Flink (a bounded KafkaSource, the JDBC sink in XA mode) beside the JSON job, Spark's beside
                  the Avro one; Debezium's JDBC sink beside the upsert; Kafka Streams and Flink's KafkaSink
                  (EXACTLY_ONCE) beside the Kafka sink
  scale           a 1,000-record and a 1M-record batch over MANY partitions against over 4 (and 50 and 200:
                  the curve; Spark Connect), the commit of their ranges, and `status` and the console's page
                  for MANY partitions behind
  parse           the DAG file over 10 to PIPELINES (200) pipeline files, each with its own table: its own time
                  (Airflow's import not counted) and `airflow dags report`'s (Airflow's DagBag parse)
  concurrent      CONCURRENT (20) pipelines, two a topic, started together on one Spark Connect server and one
                  Postgres, against as many run one after another; every table checked against its topic
  curve           the pipeline, the Spark peers, Flink and the plain consumer at 1k, 10k and 100k records; with the
                  json part's sizes, the chart of records/s against batch size (--chart, docs/benchmarks.png)
The many-keys, upsert and Avro plain consumers run in a fresh process each, their interpreter's start
not counted. Measures run in rounds (--repeat, 3): each figure is its best round (the JSON keeps every
sample), so a slow minute of a shared machine does not decide a ratio.
Prints ONE table with each target's ratio and PASS/FAIL, also written as JSON (--json). The
single-process reads report their CPU time (librdkafka's threads too). --only runs some parts.
Targets live here, not in tests. BENCH_ARGS scales it down: --records 200000 --small 100000 --many 100 --publish-big 1000000 --repeat 1.

Where things are (python scripts/bench --help; `make bench` runs it):
  cli.py         the arguments, the parts run in order, the report
  parts/         one module per part (the names above; --only takes them)
  peers/         one module per peer family: plain.py (the hand-written consumers and publisher, whose
                 programs are plain_consumer.py and plain_publisher.py), spark.py (Spark's own readers, whose
                 program is spark_peer.py), kafka_streams.py, debezium.py, flink.py; launch.py makes their
                 commands and jars (the Java sources in kafka_batch_peers/)
  harness.py     measures and their rows (the best round kept), settling the machine, the targets table
  env.py         the bench's services, its pipelines on bench topics, and their data
  runs.py        a batch run as users run it (`kafka-batch run`), timed, with its phases and processes
  sampling.py    the CPU and memory of every process a batch runs in
  checks.py      what peers' results are compared against (a topic's messages, its ground truth)
  chart.py       the chart of records/s against batch size
"""
