"""sej on Spark: the `sej` data source for PySpark, batch and streaming."""

from __future__ import annotations

from typing import Any

from .batch import SCHEMA, SejDataSource
from .session import spark_session


def register(spark: Any) -> None:
    """Register the `sej` format with a SparkSession: `spark.read.format("sej").load(path)`."""
    spark.dataSource.register(SejDataSource)


__all__ = ["SCHEMA", "SejDataSource", "register", "spark_session"]
