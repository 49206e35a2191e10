"""sej on Spark: the `sej` data source for PySpark, batch and streaming."""

from __future__ import annotations

from .schema import SCHEMA
from .session import spark_session
from .source import SejDataSource, register

__all__ = ["SCHEMA", "SejDataSource", "register", "spark_session"]
