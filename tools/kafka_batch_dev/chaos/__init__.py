"""`make chaos`: inject faults into real batches and check exactly-once against ground truth.

Every iteration produces traceable records (unique ids, integer amounts; transactions of two
transactional ids, each aborting a third of its own and committing the rest, as exactly-once producers
do; one transaction left open across the plan; a few invalid records), runs a batch through
`kafka-batch run` while a scenario strikes (SIGKILL of the job's process group in a chosen phase, among
them after the Kafka sink's transaction committed and before the Postgres one did, a
zombie left running while the run is retried, Postgres sessions terminated, two runs racing, a replay
racing a batch, Postgres or the broker restarted), lets the pipeline recover without faults, and then
checks, with a plain read_committed consumer that shares no code with the pipeline's reader:

  1. the aggregate, rows and upsert outputs equal what the committed records below the positions give
     (the upsert's: per key, the latest valid record by (partition, offset), deletes applied), and so
     does the Kafka sink's output topic, read read_committed: for JSON scenarios (shape rows) one
     message per valid record below the positions, each exactly once (a replay's marked as such); for
     Avro ones (the aggregate's changelog) the last message per page equals the expected totals;
  2. per partition, the live ledger ranges form one contiguous chain from the start to the position;
  3. no aborted record is counted, every invalid record is quarantined and none is counted;
  4. positions never move back (no reset is made here);
  5. after faults stop, lag reaches zero within a bound; no session is left idle in transaction.

A fault meant for a phase is injected only once the job is seen in that phase (from Postgres: the
attempt claimed, the commit transaction open, the batch committed); the table says how many landed.
A scenario named `<scenario>:avro` runs on a topic of Avro values in the Confluent wire format (the
local Schema Registry; the invalid records are then not in that format), checked the same way with
confluent-kafka's AvroDeserializer.

`--soak SECONDS` then runs everything at once: producers writing all along into a JSON and an Avro
topic, a pipeline on each (every sink) running batch after batch, and a fault every `--fault-every`
seconds (a run's process group killed, the pipeline's sessions terminated, a racing run, the broker
or Postgres restarted); then the producers stop, the pipelines catch up and the same checker runs.

    python scripts/chaos.py --iterations 3 --records 20000 [--scenarios kill-reading,race] [--json out.json]
    python scripts/chaos.py --scenarios '' --soak 300 --fault-every 15
"""
