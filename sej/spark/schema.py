"""The columns of the `sej` format, listed once: the Spark schema and the Arrow schema both come from COLUMNS.

client (null outside a hub root), shard, offset, timestamp (microseconds, UTC; null for
"no timestamp"), type, key, value; with option includeRoot=true, then root. The Arrow schema
(the core's, sej.columns: no Spark needed) is what the decoder's record batches carry; Spark
maps it onto the Spark schema, column by column.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .. import columns


class Column(NamedTuple):
    """One column: its name, its Spark type, the Arrow type of the decoded batches, and whether it can be null."""

    name: str
    spark_type: DataType
    arrow_type: pa.DataType
    nullable: bool


_SPARK_TYPES = {"client": StringType(), "shard": StringType(), "offset": LongType(), "timestamp": TimestampType(),
                "type": IntegerType(), "key": BinaryType(), "value": BinaryType()}  # fmt: skip

COLUMNS = tuple(Column(name, _SPARK_TYPES[name], arrow, nullable) for name, arrow, nullable in columns.COLUMN_TYPES)
"""The core's columns (sej.columns: names, Arrow types, nullability, without Spark) with their Spark types."""

SCHEMA = StructType([StructField(c.name, c.spark_type, c.nullable) for c in COLUMNS])
"""The Spark schema of a `sej` DataFrame."""

ARROW_SCHEMA = columns.ARROW_SCHEMA
"""The schema of the Arrow record batches the readers yield (the core's: sej.columns)."""

ROOT = Column(columns.ROOT_TYPE[0], StringType(), columns.ROOT_TYPE[1], columns.ROOT_TYPE[2])
"""The extra last column with option includeRoot=true: the loaded path (root) a journal was found under."""

SCHEMA_WITH_ROOT = StructType([*SCHEMA.fields, StructField(ROOT.name, ROOT.spark_type, ROOT.nullable)])
ARROW_SCHEMA_WITH_ROOT = columns.ARROW_SCHEMA_WITH_ROOT

SPARK_TYPES: dict[str, DataType] = {c.name: c.spark_type for c in COLUMNS}
"""Each column's Spark type, by name (the archive's Parquet schema takes its columns' types from here)."""

__all__ = [
    "ARROW_SCHEMA",
    "ARROW_SCHEMA_WITH_ROOT",
    "COLUMNS",
    "ROOT",
    "SCHEMA",
    "SCHEMA_WITH_ROOT",
    "SPARK_TYPES",
    "Column",
]
