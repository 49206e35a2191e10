"""Starting a SparkSession that can run the `sej` source: its Python workers run this interpreter."""

from __future__ import annotations

import os
import sys
from typing import Any

from .source import register


def spark_session(app_name: str = "sej", master: str | None = None, **conf: str) -> Any:
    """A SparkSession (new or the active one) with the `sej` format registered.

    Spark's Python workers must import sej, so PYSPARK_PYTHON defaults to this interpreter.
    `master` defaults to $SPARK_MASTER, else to what spark-submit gave, else local[2].
    Timestamps are shown in UTC unless `spark.sql.session.timeZone` is given.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    master = master or os.environ.get("SPARK_MASTER")
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ and "spark.master" not in conf:  # not under spark-submit
        builder = builder.master("local[2]")
    settings = {"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"} | conf
    for k, v in settings.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    register(session)
    return session
