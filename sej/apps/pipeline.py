"""The main job, end to end: a producer, the hub and a Spark job over the hub root.

    sej-pipeline [--work DIR] [--messages N] [--ssh ssh://[user@]host[:port]]
    python -m sej.apps.pipeline ...     (the same)

A producer process appends to a sharded journal; meanwhile this process runs the
hub's copy (`copy_all`, the engine of `sej-hub` and `sej copy`) into a hub root,
over the local transport or, with --ssh, over SFTP from that host; then Spark reads
the hub root with the `sej` data source and prints a summary per shard and per type.
It exits 0 only if Spark read every produced message exactly once (1 if not, 2 on
bad input; errors are one `sej-pipeline: error:` line unless --debug).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

import click

from .. import __version__
from ..errors import SejError
from ..hub.batch import copy_all
from ..hub.location import Origin, open_sources
from ..hub.source import Source
from ..journal import next_offset
from ..shard import ShardedWriter
from ..shard.root import find_journals
from .shell import Program, debug_option, usage

CLIENT = "edge-1"
TYPES = ("reading", "alert", "heartbeat")


def produce(root: str, count: int, shard_bit: int, segment_size: int) -> None:
    """The producer: sensor readings over 2**shard_bit shards, written in bursts."""
    with ShardedWriter(root, "events", shard_bit=shard_bit, segment_size=segment_size, durability="flush") as w:
        for i in range(count):
            sensor = f"sensor-{i % 37}"
            value = json.dumps({"n": i, "sensor": sensor, "reading": round(20 + (i % 17) * 0.25, 2)})
            w.append(value.encode(), key=sensor.encode(), type=0 if i % 10 < 7 else 1 if i % 10 < 9 else 2)
            if i % 200 == 199:
                time.sleep(0.005)
        w.sync()


def hub_messages(hub_root: str) -> int:
    return sum(next_offset(j.path) for j in find_journals(hub_root)) if os.path.isdir(hub_root) else 0


def run_hub(
    make_source: Callable[[], Source], hub_root: str, producer: multiprocessing.process.BaseProcess, total: int
) -> float:
    """Copy until the producer is done and the hub holds every message; the seconds it took."""
    t0 = time.monotonic()
    deadline = t0 + 600
    show = sys.stderr.isatty()
    with click.progressbar(length=total, label="producer -> hub", file=sys.stderr, show_pos=True) as bar:
        copied = 0
        while time.monotonic() < deadline:
            done = not producer.is_alive()
            for outcome in copy_all(make_source, hub_root, CLIENT, "hub", workers=2):
                if outcome.error is not None:
                    raise SejError(f"hub copy of {outcome.journal} failed: {outcome.error}")
            now = hub_messages(hub_root)
            if show:
                bar.update(now - copied)
            copied = now
            if done and (copied >= total or producer.exitcode != 0):
                break
            time.sleep(0.2)
    return time.monotonic() - t0


def check_spark() -> None:
    """Fail before anything runs when PySpark (sej's `spark` extra) or a Java runtime is missing."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ModuleNotFoundError as e:
        raise SejError(f"{e}: install sej with its 'spark' extra (pip install '.[spark]' in a checkout)") from None
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise SejError("Spark needs a Java runtime (17 or later): install one, e.g. apt install default-jre-headless")


def summarize(hub_root: str, master: str | None) -> tuple[int, bool]:
    """Read the hub root with Spark, print the summary; (rows, every journal's offsets contiguous)."""
    from pyspark.sql import functions as F

    from ..spark import spark_session

    conf = {"spark.ui.showConsoleProgress": str(sys.stderr.isatty()).lower(), "spark.sql.shuffle.partitions": "4"}
    spark = spark_session("sej-pipeline", master, **conf)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        df = spark.read.format("sej").load(hub_root)
        shards = (
            df.groupBy("client", "shard")
            .agg(
                F.count("*").alias("messages"),
                F.sum(F.length("value")).alias("bytes"),
                F.min("offset").alias("first"),
                F.max("offset").alias("last"),
                F.countDistinct("key").alias("keys"),
                F.max("timestamp").alias("latest"),
            )
            .orderBy("client", "shard")
            .collect()
        )
        types = df.groupBy("type").agg(F.count("*").alias("messages")).orderBy("type").collect()
    finally:
        spark.stop()
    click.echo(f"\n{'client':<8} {'shard':<12} {'messages':>9} {'bytes':>10} {'offsets':>13} {'keys':>5}  latest (UTC)")
    for r in shards:
        offsets = f"{r['first']}-{r['last']}"
        latest = r["latest"].strftime("%Y-%m-%d %H:%M:%S") if r["latest"] else "-"
        click.echo(f"{r['client']:<8} {r['shard']:<12} {r['messages']:>9} {r['bytes']:>10} {offsets:>13} "
                   f"{r['keys']:>5}  {latest}")  # fmt: skip
    click.echo(f"\n{'type':<14} {'messages':>9}")
    for r in types:
        name = TYPES[r["type"]] if r["type"] < len(TYPES) else str(r["type"])
        click.echo(f"{r['type']} {name:<12} {r['messages']:>9}")
    rows = sum(r["messages"] for r in shards)
    contiguous = all(r["messages"] == r["last"] - r["first"] + 1 for r in shards)
    return rows, contiguous


@click.command(cls=Program, name="sej-pipeline", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--work", type=click.Path(file_okay=False), help="Working directory (default: a new temporary one).")
@click.option("--messages", type=click.IntRange(1, 10**8), default=20_000, show_default=True)
@click.option("--shard-bit", type=click.IntRange(0, 8), default=2, show_default=True, help="2**BIT shards.")
@click.option("--segment-size", type=click.IntRange(1024), default=256 << 10, show_default=True)
@click.option("--ssh", "ssh_url", metavar="ssh://[user@]host[:port]", help="Copy over SFTP from this host.")
@click.option("--identity", type=click.Path(dir_okay=False), help="SSH private key (with --ssh).")
@click.option("--known-hosts", type=click.Path(dir_okay=False), help="known_hosts file (with --ssh).")
@click.option("--master", help="Spark master (default: $SPARK_MASTER or local[2]).")
@click.option("--keep", is_flag=True, help="Keep the temporary working directory.")
@debug_option()
@click.version_option(__version__, prog_name="sej-pipeline")
def main(
    work: str | None,
    messages: int,
    shard_bit: int,
    segment_size: int,
    ssh_url: str | None,
    identity: str | None,
    known_hosts: str | None,
    master: str | None,
    keep: bool,
) -> int:
    """Produce a sharded journal, copy it with the hub, summarize it with Spark."""
    base = os.path.abspath(work) if work else tempfile.mkdtemp(prefix="sej-pipeline-")
    producer_root, hub_root = os.path.join(base, "producer"), os.path.join(base, "hub")
    try:
        if (master or os.environ.get("SPARK_MASTER", "local")).startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # everything runs on this machine
        check_spark()
        os.makedirs(producer_root, exist_ok=True)
        origin = Origin(producer_root)
        if ssh_url:
            origin = Origin.parse(ssh_url.rstrip("/") + producer_root, identity=identity, known_hosts=known_hosts)
            if origin.is_local:
                raise usage(f"--ssh must look like ssh://[user@]host[:port], got {ssh_url!r}")
        with open_sources(origin) as sources:
            transport = "local transport" if origin.is_local else f"SFTP from {sources.label}"
            click.echo(f"producer: {messages} messages into {producer_root} ({2**shard_bit} shards)")
            click.echo(f"hub:      {hub_root} (client {CLIENT}, {transport})")
            producer = multiprocessing.get_context("spawn").Process(
                target=produce, args=(producer_root, messages, shard_bit, segment_size)
            )
            producer.start()
            try:
                took = run_hub(sources, hub_root, producer, messages)
            finally:
                producer.join(60)
        copied = hub_messages(hub_root)
        click.echo(f"hub copied {copied} of {messages} messages in {took:.1f} s")
        if producer.exitcode != 0:
            click.echo(f"pipeline FAILED: the producer exited with {producer.exitcode}", err=True)
            return 1
        click.echo(f"spark:    reading {hub_root} ({master or os.environ.get('SPARK_MASTER') or 'local[2]'})")
        rows, contiguous = summarize(hub_root, master)
        ok = rows == messages == copied and contiguous
        if ok:
            click.echo(f"\npipeline OK: {messages} messages produced, copied by the hub and read by Spark exactly once")
        else:
            click.echo(f"\npipeline FAILED: produced {messages}, hub {copied}, Spark read {rows}", err=True)
        return 0 if ok else 1
    finally:
        if not work and not keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
