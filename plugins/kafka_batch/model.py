"""The base of every typed section of a pipeline definition, and how a definition's mistakes are said.

Pipeline definitions are pydantic models (`config.Pipeline`, each sink's settings): the types say what
is allowed, the JSON Schema editors use comes from them, and a mistake becomes one line naming the
file, the field's path, what was wrong and what is allowed. Unknown keys are refused, never ignored:
a misspelled setting silently left at its default is the worst kind of mistake.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import textwrap
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, ValidationError, model_validator
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import PydanticCustomError

from kafka_batch.errors import InputError

IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class Model(BaseModel):
    """A section of a definition: immutable, unknown keys refused (naming the known ones), numbers
    strict (`"5"` or `true` is not a count), field docstrings as the schema's descriptions (DescribedSchema)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = [info.alias or name for name, info in cls.model_fields.items()]
            unknown = sorted(str(k) for k in data if k not in known)
            if unknown:
                raise PydanticCustomError("unknown_keys", "unknown key(s) {unknown}; known: {known}",
                                          {"unknown": unknown, "known": sorted(known)})
        return data


class DescribedSchema(GenerateJsonSchema):
    """The JSON Schema with each field's docstring (the string under it) as its description.

    Read from the classes' source only when a schema is made: pydantic's `use_attribute_docstrings`
    parses every model's source as the class is created, 0.1-0.2 s of each process that loads a
    definition (every CLI command and every Airflow task). A description given in `Field` wins."""

    def model_schema(self, schema):
        json_schema = super().model_schema(schema)
        docs = field_docstrings(schema["cls"])
        properties = json_schema.get("properties", {})
        for name, field in schema["cls"].model_fields.items():
            described = properties.get(field.alias or name)
            if described is not None and name in docs and "description" not in described:
                described["description"] = docs[name]
        return json_schema


def field_docstrings(cls: type) -> dict[str, str]:
    """{field: docstring} of a class and its bases: a string right under an annotated field."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:cls.__mro__.index(BaseModel)]):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # a built-in or generated class: no source
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for field, below in itertools.pairwise(body):
            if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                    and isinstance(below, ast.Expr) and isinstance(below.value, ast.Constant)
                    and isinstance(below.value.value, str)):
                docs[field.target.id] = inspect.cleandoc(below.value.value)
    return docs


def _identifier(value: str) -> str:
    if not IDENTIFIER.match(value):
        raise PydanticCustomError("identifier", "{value!r} must be a lower-case SQL identifier ([a-z_][a-z0-9_]*)",
                                  {"value!r": repr(value)})
    return value


def _expression(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("expression", "an expression must not be empty")
    return value


Identifier = Annotated[str, Strict(), AfterValidator(_identifier),
                       Field(json_schema_extra={"pattern": IDENTIFIER.pattern})]
"""A table or column name: it reaches SQL only once validated (and always quoted)."""
Expression = Annotated[str, Strict(), AfterValidator(_expression), Field(min_length=1)]
"""A Spark SQL expression over the record's fields and metadata columns."""
TopicName = Annotated[str, Strict(), Field(min_length=1)]
"""A Kafka topic's name."""
PositiveInt = Annotated[int, Strict(), Field(gt=0)]
PositiveNumber = Annotated[float, Strict(), Field(gt=0)]


def _path(loc: tuple) -> str:
    """`sinks.aggregate.measures.views.type`; a mapping's key error names the key; a union's tag
    (`<...>`, see config) is not a field and is left out."""
    parts: list[str] = []
    for part in loc:
        if part == "[key]":
            parts[-1] = f"{parts[-1]} (as a name)" if parts else "(a name)"
        elif not (isinstance(part, str) and part.startswith("<")):
            parts.append(str(part))
    return ".".join(parts)


def _message(error: dict) -> str:
    message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    path = _path(error["loc"])
    value = error.get("input")
    said = error["type"] in ("unknown_keys", "missing") or isinstance(value, dict) or (
        repr(value) in message and not isinstance(value, int | float))
    got = "" if said else f" (got {value!r})"
    return f"{path}: {message}{got}" if path else f"{message}{got}"


def invalid(where: str, exc: ValidationError, most: int = 3) -> InputError:
    """A definition's validation errors as one line: `pipeline <where>: <field path>: <what> (got ...)`."""
    errors = exc.errors(include_url=False)
    said = "; ".join(_message(e) for e in errors[:most])
    more = f" (and {len(errors) - most} more)" if len(errors) > most else ""
    return InputError(f"pipeline {where}: {said}{more}")
