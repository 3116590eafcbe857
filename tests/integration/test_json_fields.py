"""The reader's JSON fast path (pyarrow) against Spark's from_json, value by value, on a real session.

from_json defines what a record's fields are; the fast path may leave any chunk to it, but on every
value it accepts it must give exactly what from_json gives (or a record could be counted by a sink
and quarantined by the second read). The expected fields here come from Spark, never from our code.
"""

from __future__ import annotations

import math

import pytest

from kafka_batch.spark.json_fields import FAST_MAX_VALUE_BYTES, parse_values

pytestmark = pytest.mark.integration
FIELDS = {"s": "string", "l": "long", "i": "int", "d": "double", "b": "boolean"}
PLAIN = [
    b'{"s":"a","l":1,"i":2,"d":0.5,"b":true}',
    b'{"s":"","l":-9223372036854775808,"i":-2147483648,"d":-0.0,"b":false}',
    b'{"l":9223372036854775807,"i":2147483647,"d":5,"s":"x"}',
    b'{ "s" : "a b" , "extra" : {"s": "nested, ignored", "l": [1, 2, {"x": null}]} }',
    b'{}',
    b'{"s":null,"l":null,"i":null,"d":null,"b":null}',
    b'{"s":"\\u00e9\\ud83d\\ude00 \\"q\\" \\\\ \\/ \\n\\t","d":1e-400}',
    '{"s":"é漢字","d":123456789012345678901234567890}'.encode(),
    b'{"s":"a\\u0000b","d":0.1000000000000000055511151231257827,"l":-0}',
    b'{"us\\u0065r":1,"\\u0073":"escaped name"}',
    b'{"S":"other case","L":1}',
    b'{"x":' + b"[" * 400 + b"]" * 400 + b"}",
    b'{"d":NaN}', b'{"d":Infinity,"l":1}', b'{"d":-Infinity}',
    b'{"d":1.7976931348623157e308,"s":"' + b"y" * 900 + b'"}',
]
# Values pyarrow or Spark refuses or reads differently: the fast path must leave them to from_json.
ODD = [
    b'null', b'[1]', b'"x"', b'1', b'', b' {"s":"a"}', b'{"s":"a"} ', b'\xef\xbb\xbf{"s":"a"}',
    b'{"s":1}', b'{"s":{"a":1}}', b'{"s":[1]}', b'{"s":true}',
    b'{"l":1.5}', b'{"l":1e2}', b'{"l":"1"}', b'{"l":9223372036854775808}', b'{"i":2147483648}',
    b'{"d":"NaN"}', b'{"d":1e400}', b'{"d":"1.5"}', b'{"b":"true"}', b'{"b":1}', b'{"l":007}',
    b'{"s":"a","s":"b"}', b"{'s':'single quotes'}", b'{"s":"a",}', b'{s:"unquoted"}', b'{"s":"a"} x',
    b'{"s":"a"}{"s":"b"}', b'{"s":"a"}\n{"s":"b"}', b'{"s":"raw\nline"}', b'{"s":"raw\ttab"}',
    b'{"s":"bad \xff utf-8"}', b'{"s":"\xc0\xaf"}', b'{"s":"lone \\ud800"}', b'{"s":"\\x41"}',
    b'{\r\n"s":"crlf"}', b'{"s":"a"', b'{"s":"a","x":' + b"[" * 1200 + b"]" * 1200 + b'}',
    b'{"s":"a","x":' + b"1" * 1100 + b'}', b'{"s":"' + b"z" * FAST_MAX_VALUE_BYTES + b'"}',
]


def by_spark(spark, values: list[bytes | None]) -> list[tuple]:
    from pyspark.sql import functions as F

    schema = ", ".join(f"`{n}` {t}" for n, t in FIELDS.items())
    rows = spark.createDataFrame([(i, v) for i, v in enumerate(values)], "i int, value binary").select(
        "i", F.from_json(F.col("value").cast("string"), schema).alias("f")).orderBy("i").collect()
    return [tuple(row["f"][n] for n in FIELDS) if row["f"] is not None else (None,) * len(FIELDS) for row in rows]


def by_reader(values: list[bytes | None]) -> tuple[bool, list[tuple]]:
    parsed, *columns = parse_values(values, FIELDS)
    flags = set(parsed.to_pylist())
    assert len(flags) <= 1, "a chunk is parsed whole or not at all"
    return flags == {True}, list(zip(*(c.to_pylist() for c in columns), strict=True))


def same(a: tuple, b: tuple) -> bool:
    """Equal fields; doubles by value and sign (-0.0 is not 0.0, NaN is NaN)."""
    def double(x: float, y: float) -> bool:
        return (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))

    return all(double(x, y) if isinstance(x, float) and isinstance(y, float) else x == y
               for x, y in zip(a, b, strict=True))


def test_every_value_the_reader_parses_has_the_fields_from_json_gives(spark):
    expected = by_spark(spark, PLAIN + ODD)
    accepted = 0
    for value, spark_fields in zip(PLAIN + ODD, expected, strict=True):
        parsed, [fields] = by_reader([value])
        if parsed:
            accepted += 1
            assert same(fields, spark_fields), f"{value[:80]!r}: reader {fields}, from_json {spark_fields}"
        assert parsed == (value in PLAIN), f"{value[:80]!r}: {'parsed' if parsed else 'left to from_json'}"
    assert accepted == len(PLAIN)


def test_a_chunk_is_parsed_whole_and_in_order_with_its_tombstones_or_left_whole_to_from_json(spark):
    chunk = [*PLAIN, None, *reversed(PLAIN), None]
    parsed, fields = by_reader(chunk)
    expected = by_spark(spark, chunk)
    assert parsed and len(fields) == len(chunk)
    assert all(same(a, b) for a, b in zip(fields, expected, strict=True))
    for odd in ODD:
        parsed, fields = by_reader([*PLAIN, odd, *PLAIN])
        assert not parsed and all(f == (None,) * len(FIELDS) for f in fields), odd[:80]


def test_a_document_split_over_two_values_never_shifts_the_rows(spark):
    """Joined by line breaks, the first two values would be one document and the third two: as many
    rows as values, each in the wrong place. The chunk goes to from_json instead."""
    chunk = [b'{"s":"a","t":', b'{"s":"b"}}', b'{"s":"c"}{"s":"d"}']
    parsed, fields = by_reader(chunk)
    assert not parsed, f"parsed as {fields}; from_json gives {by_spark(spark, chunk)}"
