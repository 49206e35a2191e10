"""The rehearsal's Spark driver: one `availableNow` run of the streaming query over the hub root into Parquet.

Run as `python -m testing.rehearsal.spark_job HUB_ROOT OUT CHECKPOINT QUERY`. The query reads the hub
root with the `sej` source, keeps its progress as the reader `spark-QUERY` (what the hub's retention
requires), and writes each row's id (the value up to `|`), journal, offset and the time its batch ran
to OUT, a Parquet file sink: exactly once through the checkpoint, also when this driver is SIGKILLed
mid-batch. Prints `rows <n>` (Spark's own count of OUT, through the sink's log) when done.
"""

from __future__ import annotations

import sys

from pyspark.sql import functions as F

from sej.spark import spark_session


def main(argv: list[str]) -> None:
    hub_root, out, checkpoint, query = argv[:4]
    spark = spark_session(f"rehearsal-{query}", "local[1]", **{"spark.ui.enabled": "false",
                          "spark.sql.shuffle.partitions": "1", "spark.driver.memory": "768m"})  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    stream = spark.readStream.format("sej").option("queryName", query).option("maxOffsetsPerTrigger", 200_000)
    rows = stream.load(hub_root).select(
        F.element_at(F.split(F.col("value").cast("string"), r"\|"), 1).alias("id"),
        F.concat_ws(".", "client", "shard").alias("journal"),
        "offset",
        F.current_timestamp().alias("ingested"),
    )
    (rows.writeStream.format("parquet").option("checkpointLocation", checkpoint).queryName(query)
     .trigger(availableNow=True).start(out).awaitTermination())  # fmt: skip
    print("rows", spark.read.parquet(out).count(), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
