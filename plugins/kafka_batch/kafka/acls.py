"""What a pipeline's Kafka user must be allowed, and the one line a broker's refusal becomes.

A secured cluster (KRaft's StandardAuthorizer, or any authorizer) gives a principal nothing it has no
ACL for. A pipeline needs only:
- on each input topic: Describe (partitions, offsets) and Read (the ranges); on the readers' group
  (kafka.source.READER_GROUP, or the connection's `group.id`): Describe, as librdkafka's consumer looks
  its coordinator up (nothing is committed to it);
- for a Kafka sink, on its output topic: Describe, Write, DescribeConfigs (its min.insync.replicas,
  checked before a batch publishes) and Read (`status`: how old an open transaction is); on its
  transactional id: Describe and Write; on its publish group (named like the id): Describe (reading the
  last published batch) and Read (committing the batch's identity with its transaction).
Nothing on the cluster: Kafka 3.0 and later let a producer be idempotent with Write on its
transactional id (KIP-679), and describing the cluster needs no ACL.

`required` lists them for a pipeline; `kafka_acls_commands` prints them for `kafka-acls.sh`; `apply`
creates them through the admin API. A broker's refusal of a missing one is an InputError (exit 2, never
retried: only an operator's grant helps), made by kafka.source's `refused` wherever a client meets it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kafka_batch.errors import InputError
from kafka_batch.kafka.publish import transactional_id
from kafka_batch.kafka.source import READER_GROUP, refused


@dataclass(frozen=True)
class Grant:
    """ALLOW `operations` on one resource (`topic`, `group` or `transactional-id`, as kafka-acls.sh names
    them); `prefixed`: on every name that begins with `name`; `output`: for the Kafka sink's connection
    (`connections.kafka_output`), else for the input's."""

    resource: str
    name: str
    operations: tuple[str, ...]
    why: str
    prefixed: bool = False
    output: bool = False


def literal_prefix(pattern: str) -> str | None:
    """The literal prefix of a pattern of the form `<prefix>.*` (dots escaped), else None."""
    match = re.fullmatch(r"((?:[A-Za-z0-9_-]|\\\.)*)\.\*", pattern)
    return match.group(1).replace("\\.", ".") if match and match.group(1) else None


def required(pipeline, matching: Iterable[str] = (), reader_group: str = READER_GROUP) -> list[Grant]:
    """The grants `pipeline` needs. A `topic_pattern` of the form `<prefix>.*` is one prefixed grant; any
    other is a grant per topic it matches now (`matching`), and a topic created later needs its own."""
    inputs = ("Describe", "Read")
    why = "read the input: partitions and offsets (Describe), the ranges (Read)"
    grants = [Grant("topic", topic, inputs, why) for topic in pipeline.topics]
    if pipeline.topic_pattern is not None:
        prefix = literal_prefix(pipeline.topic_pattern)
        grants += ([Grant("topic", prefix, inputs, why, prefixed=True)] if prefix else
                   [Grant("topic", topic, inputs, f"{why}; matches /{pipeline.topic_pattern}/ now")
                    for topic in sorted(matching)])
    grants.append(Grant("group", reader_group, ("Describe",), "the readers' consumer looks its group's coordinator up"
                        " (librdkafka's; nothing is committed to it)"))
    for sink in pipeline.publishing_sinks:
        tid = transactional_id(pipeline.name, sink.topic)
        grants += [
            Grant("topic", sink.topic, ("Describe", "Write", "DescribeConfigs", "Read"),
                  "publish (Write); check min.insync.replicas first (DescribeConfigs); status: open transactions' age"
                  " (Read)", output=True),
            Grant("transactional-id", tid, ("Describe", "Write"), "one transaction per batch, fencing older attempts",
                  output=True),
            Grant("group", tid, ("Describe", "Read"), "the publish group: the last published batch (Describe), the"
                  " batch's identity committed with its transaction (Read)", output=True),
        ]
    return grants


def kafka_acls_commands(grants: Iterable[Grant], principal: str, bootstrap: str = "<bootstrap>",
                        config: str = "<admin.properties>") -> list[str]:
    """One `kafka-acls.sh --add` command per grant, as an operator pastes them."""
    lines = []
    for grant in grants:
        words = ["kafka-acls.sh", "--bootstrap-server", bootstrap, "--command-config", config, "--add",
                 "--allow-principal", principal, *(w for op in grant.operations for w in ("--operation", op)),
                 f"--{grant.resource}", grant.name, *(["--resource-pattern-type", "prefixed"] if grant.prefixed else [])]
        lines.append(f"# {grant.why}\n" + " ".join(shlex.quote(w) for w in words))
    return lines


def bindings(grants: Iterable[Grant], principal: str) -> list:
    """The grants as the admin API's ACL bindings (host `*`)."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    kinds = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP, "transactional-id": ResourceType.TRANSACTIONAL_ID}
    return [AclBinding(kinds[g.resource], g.name, ResourcePatternType.PREFIXED if g.prefixed else ResourcePatternType.LITERAL,
                       principal, "*", AclOperation[_upper_snake(op)], AclPermissionType.ALLOW)
            for g in grants for op in g.operations]


def _upper_snake(operation: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", operation).upper()  # DescribeConfigs -> DESCRIBE_CONFIGS


def apply(admin_config: dict[str, Any], grants: Iterable[Grant], principal: str, timeout: float = 30.0) -> int:
    """Create the grants' ACLs as the connection's user (who needs Alter on the cluster); how many."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from kafka_batch.kafka.bounded import GRACE_SECONDS

    admin = AdminClient(admin_config)
    acls = bindings(grants, principal)
    for binding, future in admin.create_acls(acls, request_timeout=timeout).items():
        try:
            future.result(timeout=timeout + GRACE_SECONDS)
        except KafkaException as exc:
            raise (refused(exc.args[0], "creating ACLs") or InputError(
                f"Kafka did not create the ACL {binding}: {exc.args[0].str()}")) from None
    return len(acls)
