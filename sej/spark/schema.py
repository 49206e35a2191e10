"""The columns of the `sej` format, listed once: the Spark schema and the Arrow schema both come from COLUMNS.

client (null outside a hub root), shard, offset, timestamp (microseconds, UTC; null for
"no timestamp"), type, key, value; with option includeRoot=true, then root. The Arrow schema
is what the decoder's record batches carry; Spark maps it onto the Spark schema, column by column.
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


class Column(NamedTuple):
    """One column: its name, its Spark type, the Arrow type of the decoded batches, and whether it can be null."""

    name: str
    spark_type: DataType
    arrow_type: pa.DataType
    nullable: bool


COLUMNS = (
    Column("client", StringType(), pa.string(), True),
    Column("shard", StringType(), pa.string(), False),
    Column("offset", LongType(), pa.int64(), False),
    Column("timestamp", TimestampType(), pa.timestamp("us", tz="UTC"), True),
    Column("type", IntegerType(), pa.int32(), False),
    Column("key", BinaryType(), pa.binary(), False),
    Column("value", BinaryType(), pa.binary(), False),
)

SCHEMA = StructType([StructField(c.name, c.spark_type, c.nullable) for c in COLUMNS])
"""The Spark schema of a `sej` DataFrame."""

ARROW_SCHEMA = pa.schema([pa.field(c.name, c.arrow_type, c.nullable) for c in COLUMNS])
"""The schema of the Arrow record batches the readers yield."""

ROOT = Column("root", StringType(), pa.string(), False)
"""The extra last column with option includeRoot=true: the loaded path (root) a journal was found under."""

SCHEMA_WITH_ROOT = StructType([*SCHEMA.fields, StructField(ROOT.name, ROOT.spark_type, ROOT.nullable)])
ARROW_SCHEMA_WITH_ROOT = ARROW_SCHEMA.append(pa.field(ROOT.name, ROOT.arrow_type, ROOT.nullable))

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
