"""The `sej` format as PySpark sees it: the DataSource that gives Spark the schema and the readers."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from .batch import SejBatchReader, SejFilteringReader
from .options import BATCH_OPTIONS, STREAM_OPTIONS, bool_option, checked, lower_case
from .schema import SCHEMA, SCHEMA_WITH_ROOT
from .stream import SejStreamReader


class SejDataSource(DataSource):
    """The `sej` format: `spark.read.format("sej")` and `spark.readStream.format("sej")`."""

    @classmethod
    def name(cls) -> str:
        return "sej"

    def schema(self) -> StructType:
        return SCHEMA_WITH_ROOT if bool_option(lower_case(self.options), "includeroot", False) else SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        options = checked(self.options, BATCH_OPTIONS, "spark.read.format('sej')")
        # Two classes: a reader with pushFilters fails unless Spark's filterPushdown is on (see SejFilteringReader).
        if bool_option(options, "pushfilters", False, strict=False):
            return SejFilteringReader(options)
        return SejBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return SejStreamReader(checked(self.options, STREAM_OPTIONS, "spark.readStream.format('sej')"))


def register(spark: Any) -> None:
    """Register the `sej` format with a SparkSession: `spark.read.format("sej").load(path)`."""
    spark.dataSource.register(SejDataSource)


__all__ = ["SejDataSource", "register"]
