"""The benchmarks of scripts/bench.py (its entry point: run that script, it puts the repository on sys.path).

The harness:

- `common`: the messages (100-byte values, 8-byte keys; the varied and JSON shapes), the sizes of full and --quick runs, scratch helpers.
- `results`: a benchmark's result (title, description, table rows, notes) and its table cells.
- `load`: the CPU time other processes take meanwhile (from /proc), and waiting for an idle machine.
- `report`: docs/benchmarks.md rendered from the results, and an --only run merged into an existing report.
- `main`: the command line and the list of steps (which module measures which benchmarks, in report order).

One module per subject, each measuring sej against a baseline:

- `writes`: 1 and 2, `Writer.append` and `Writer.append_many` against a raw `f.write` loop.
- `scan`: 3, `Scanner` iteration against a raw decode loop.
- `group_commit`: 4, durable appends from many threads on one writer against an fsync per message.
- `follow`: 5, the latency of a follower behind a writer in another process.
- `open_seek`: 6 and 9, opening a 1 GiB journal and seeking to its middle; `sej scan --count` on it.
- `sqlite`: 7, the same appends and scans in SQLite.
- `sharded`: 8, `ShardedWriter` over 256 shards against one `Writer`.
- `hub`: 10 and 11, the hub's copy over loopback SSH against scp; append-to-hub latency while `sej-hub` runs.
- `spark`: 12, `spark.read.format("sej")` against `spark.read.parquet`.
- `spark_scale`: 13, Spark over a hub root of many small journals, against Parquet.
- `hub_scale`: 14, `sej copy` passes over 10 to 1,000 journals against rsync; `sej-hub`'s latency at those sizes.
- `hub_sums`: 18, a hub pass over a journal that flushes every message, against reading its checksum file whole.
"""
