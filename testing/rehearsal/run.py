"""The rehearsal's orchestration: start the pipeline, break it on schedule, let it heal, check it (docs/rehearsal.md).

The parts, as in production: producer processes (`producer`), `sej-hub` over a real OpenSSH sshd, `sej-retention`
on both sides as cron runs it, a streaming `availableNow` query and `sej-archive` (`spark_job`). One loop ticks
every TICK seconds: it starts what is due, injects the faults of `faults.schedule`, reads the acks, measures
latencies and samples the daemon. After `duration`, the faults stop, the producers stop, and the checks run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testing.sshd import Sshd, free_port
from testing.timing import scaled

from . import check
from .faults import Fault, schedule
from .observe import Acks, Latency, hub_journals, process_resources

TICK = 0.25
CLIENT = "c1"
QUERY = "rehearsal"
WORKERS = 4  # hub.toml's workers
REPO = str(Path(__file__).resolve().parents[2])


@dataclass
class Plan:
    seed: int = 1
    duration: float = 240.0  # seconds of traffic and faults, before the quiet end
    producers: int = 3
    prefixes: int = 4  # per producer: producers * prefixes * 2**shard_bit journals at most
    shard_bit: int = 1
    grow_every: float = 0.0  # a producer opens a new prefix every this many seconds (0: duration * 0.4 / prefixes)
    rate: float = 30.0  # messages per second per busy prefix
    segment_size: int = 16384
    poll_interval: float = 0.2
    transport: str = "sftp"  # hub.toml's: "sftp", or "serve" (this interpreter's `sej serve` on the producer)
    producer_retention_every: float = 10.0
    producer_max_messages: int = 200
    hub_retention_every: float = 30.0
    hub_max_messages: int = 2000
    spark_every: float = 30.0  # seconds between the end of one streaming run and the start of the next
    archive_every: float = 300.0
    sample_every: float = 5.0
    check_every: float = 300.0  # the checks that hold at any time (no duplicate, hub a prefix)
    catch_up: float = 120.0  # the bound, once faults stop, for every journal to be at the hub (scaled)


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: str
    popen: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    runs: int = 0

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open(self.log, "ab") as log:
            # Its own process group: a kill takes its children too (Spark's JVM, ssh).
            self.popen = subprocess.Popen(self.argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env,
                                          start_new_session=True)  # fmt: skip
        self.started, self.runs = time.monotonic(), self.runs + 1

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            assert self.popen is not None
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass
        if self.popen is not None and sig == signal.SIGKILL:
            self.popen.wait(scaled(30))


@dataclass
class Tally:
    faults: dict[str, int] = field(default_factory=dict)
    spark_runs: int = 0
    spark_failed: list[str] = field(default_factory=list)
    archive_runs: int = 0
    retention_runs: int = 0
    producer_deleted: list[tuple[str, int, int]] = field(default_factory=list)
    hub_deleted: list[tuple[str, int, int]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)

    def count(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1


class Rehearsal:
    def __init__(self, workdir: str | Path, plan: Plan) -> None:
        self.plan = plan
        if not plan.grow_every:
            plan.grow_every = max(1.0, plan.duration * 0.4 / plan.prefixes)
        self.dir = Path(workdir)
        for d in ("producer", "hub", "out", "checkpoint", "archive", "acks", "logs"):
            (self.dir / d).mkdir(parents=True, exist_ok=True)
        self.producer_root, self.hub_root = str(self.dir / "producer"), str(self.dir / "hub")
        self.out, self.logs = str(self.dir / "out"), self.dir / "logs"
        self.tally = Tally()
        self.acks = Acks(str(self.dir / "acks"))
        self.latency = Latency(self.hub_root, CLIENT)
        self.start_wall = time.time()
        self.t0 = time.monotonic()
        self.sshd: Sshd | None = None
        self.producers: list[Proc] = []
        self.hub: Proc | None = None
        self.spark: Proc | None = None  # the streaming run or sej-archive: one JVM at a time
        self.spark_kind = ""
        self.spark_kill_at: float | None = None
        self.spark_kills_owed = 0
        self.jobs: dict[str, Proc] = {}
        self.due: dict[str, float] = {}
        self.metrics_port = free_port()
        self.hub_logs: list[str] = []
        self.rng = random.Random(f"run/{plan.seed}")
        self.quiet = False  # the faults are over and the producers stopped

    # -- parts -------------------------------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.t0

    def py(self, *args: str) -> list[str]:
        return [sys.executable, *args]

    def start_sshd(self) -> None:
        self.sshd = Sshd()
        s = self.sshd
        conf = (f'hub_root = "{self.hub_root}"\nhub_name = "hub"\npoll_interval = {self.plan.poll_interval}\n'
                f'commit_interval = 1.0\nworkers = {WORKERS}\nbackoff_max = 5.0\n'
                f'metrics_listen = "127.0.0.1:{self.metrics_port}"\n'
                f'health_max_age = 30.0\nlog_format = "json"\n\n[[client]]\nclient_id = "{CLIENT}"\nhost = "{s.host}"\n'
                f'port = {s.port}\nuser = "{s.user}"\nidentity_file = "{s.identity}"\nknown_hosts = "{s.known_hosts}"\n'
                f'remote_root = "{self.producer_root}"\ntransport = "{self.plan.transport}"\n'
                f'serve_command = "{sys.executable} -m sej.apps.cli"\n')  # fmt: skip
        (self.dir / "hub.toml").write_text(conf)

    def start_producer(self, i: int) -> None:
        p = self.producers[i]
        opts = {"rate": self.plan.rate, "prefixes": self.plan.prefixes, "grow_every": self.plan.grow_every,
                "segment_size": self.plan.segment_size, "shard_bit": self.plan.shard_bit}  # fmt: skip
        p.argv = self.py("-m", "testing.rehearsal.producer", self.producer_root, f"p{i}", str(p.runs),
                         str(self.plan.seed), str(self.start_wall), str(self.dir / "acks" / f"p{i}"),
                         json.dumps(opts))  # fmt: skip
        p.start()

    def start_hub(self) -> None:
        n = len(self.hub_logs)
        self.hub_logs.append(str(self.logs / f"hub.{n}.log"))
        self.hub = Proc("hub", self.py("-m", "sej.apps.hub", "--config", str(self.dir / "hub.toml")), self.hub_logs[-1])
        self.hub.start()

    def run_job(self, name: str, argv: list[str]) -> None:
        """A cron job: started when due, unless its last run is still going (as flock-guarded cron jobs are)."""
        job = self.jobs.get(name)
        if job is not None and job.alive():
            return
        if job is not None:
            self.finished_job(name, job)
        job = self.jobs[name] = Proc(name, argv, str(self.logs / f"{name}.{self.tally.retention_runs}.log"))
        job.start()
        self.tally.retention_runs += 1

    def finished_job(self, name: str, job: Proc) -> None:
        """What a retention run deleted, checked against the readers it must wait for."""
        assert job.popen is not None
        job.popen.wait(scaled(60))
        text = Path(job.log).read_text(errors="replace")
        deleted = check.deleted_ranges(text)
        if name == "producer-retention":
            self.tally.producer_deleted += deleted
            for journal, _first, last in deleted:  # the hub had all of it: its copy is past it
                hub = os.path.join(self.hub_root, f"{CLIENT}.{os.path.basename(journal)}")
                have = _next_offset(hub)
                if have <= last:
                    self.tally.problems.append(f"producer retention deleted {journal} up to {last}; the hub has {have}")
        else:
            self.tally.hub_deleted += deleted
        if job.popen.returncode not in (0, None):
            self.tally.problems.append(f"{name} exited {job.popen.returncode}: {text[-500:]}")
        os.remove(job.log)

    def hub_retention(self) -> list[str]:
        return self.py("-m", "sej.apps.retention", self.hub_root, "--max-messages", str(self.plan.hub_max_messages),
                       "--require-reader", f"spark-{QUERY}", "--require-reader", "archive")  # fmt: skip

    def start_spark(self, kind: str) -> None:
        if kind == "stream":
            argv = self.py("-m", "testing.rehearsal.spark_job", self.hub_root, self.out, str(self.dir / "checkpoint"),
                           QUERY)  # fmt: skip
            self.tally.spark_runs += 1
        else:
            argv = self.py("-m", "sej.apps.archive", self.hub_root, str(self.dir / "archive"), "--master", "local[1]")
            self.tally.archive_runs += 1
        self.spark = Proc(kind, argv, str(self.logs / f"spark.{kind}.log"))
        self.spark_kind = kind
        self.spark.start()

    # -- the loop ----------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        plan = self.plan
        try:
            self.start_sshd()
            self.producers = [Proc(f"p{i}", [], str(self.logs / f"producer.{i}.log")) for i in range(plan.producers)]
            for i in range(plan.producers):
                self.start_producer(i)
            self.start_hub()
            faults = schedule(plan.seed, plan.duration, plan.producers)
            restarts: list[tuple[float, str, int]] = []
            next_check = plan.check_every
            while self.now() < plan.duration:
                t = self.now()
                while faults and faults[0].at <= t:
                    restarts += self.inject(faults.pop(0))
                for r in [r for r in restarts if r[0] <= t]:
                    restarts.remove(r)
                    restarts += self.restart(r[1], r[2])
                self.tick(t)
                if t >= next_check:
                    self.checkpoint(complete=False)
                    next_check += plan.check_every
                time.sleep(TICK)  # the loop's pace; every wait below is on a condition
            for _, what, i in restarts:
                if what != "cut":
                    self.restart(what, i)
            return self.finish()
        finally:
            self.stop()

    def tick(self, t: float) -> None:
        plan = self.plan
        for i, p in enumerate(self.producers):
            if self.quiet:
                break
            if not p.alive() and p.popen is not None and p.popen.returncode not in (-signal.SIGKILL,):
                self.tally.problems.append(f"producer {i} exited {p.popen.returncode} by itself (see {p.log})")
                self.start_producer(i)
        hub = self.hub
        if hub is not None and not hub.alive() and hub.popen is not None and hub.popen.returncode != -signal.SIGKILL:
            self.tally.problems.append(f"sej-hub exited {hub.popen.returncode} by itself (see {hub.log})")
            self.start_hub()
        if not os.listdir(self.producer_root):
            pass  # no journal yet: sej-retention refuses a root without one (a typo would look like it)
        elif t >= self.due.get("producer-retention", 0):
            self.due["producer-retention"] = t + plan.producer_retention_every
            self.run_job(
                "producer-retention",
                self.py(
                    "-m",
                    "sej.apps.retention",
                    self.producer_root,
                    "--max-messages",
                    str(plan.producer_max_messages),
                    "--require-reader",
                    "hub",
                ),
            )
        if hub_journals(self.hub_root) and t >= self.due.get("hub-retention", plan.hub_retention_every):
            self.due["hub-retention"] = t + plan.hub_retention_every
            self.run_job("hub-retention", self.hub_retention())
        self.spark_lane(t)
        self.latency.add(self.acks.read())
        self.latency.poll()
        if t >= self.due.get("sample", 0):
            self.due["sample"] = t + plan.sample_every
            self.sample(t)

    def spark_lane(self, t: float) -> None:
        if self.spark is not None and self.spark.alive():
            if self.spark_kill_at is None and self.spark_kind == "stream" and self.spark_kills_owed and _mid_batch(
                    str(self.dir / "checkpoint")):  # fmt: skip
                self.spark_kill_at = t + self.rng.uniform(0, 2)
            if self.spark_kill_at is not None and t >= self.spark_kill_at:
                self.spark.kill()
                self.spark_kills_owed -= 1
                self.tally.count("spark_kill")
                self.spark_kill_at = None
            return
        if self.spark is not None:
            self.spark_ended(t)
        if t >= self.due.get("archive", self.plan.archive_every) and hub_journals(self.hub_root):
            self.due["archive"] = t + self.plan.archive_every
            self.start_spark("archive")
        elif t >= self.due.get("spark", 0):
            self.start_spark("stream")

    def spark_ended(self, t: float) -> None:
        assert self.spark is not None and self.spark.popen is not None
        code = self.spark.popen.returncode
        if code not in (0, -signal.SIGKILL):
            tail = Path(self.spark.log).read_text(errors="replace")[-2000:]
            self.tally.spark_failed.append(f"{self.spark_kind} exited {code}: {tail}")
        self.spark = None
        self.spark_kill_at = None
        self.due["spark"] = t + self.plan.spark_every

    def inject(self, f: Fault) -> list[tuple[float, str, int]]:
        """Break something now; what to restart when."""
        t = self.now()
        if f.kind == "producer_kill":
            self.producers[f.target].kill()
            self.tally.count(f.kind)
            return [(t + f.down, "producer", f.target)]
        if f.kind == "hub_kill" and self.hub is not None and self.hub.alive():
            self.hub.kill()
            self.tally.count(f.kind)
            return [(t + f.down, "hub", 0)]
        if f.kind == "sshd_outage" and self.sshd is not None and self.sshd.process is not None:
            self.sshd.pause()
            self.tally.count(f.kind)
            return [(t + f.down, "sshd", 0)]
        if f.kind == "cut":
            if self.sshd is not None and self.sshd.process is not None and self.sshd.kill_connections():
                self.tally.count(f.kind)
            elif f.target < 20:  # no connection to cut now (an outage, a backoff): again a little later
                return [(t + 1.0, "cut", f.target + 1)]
        if f.kind == "spark_kill":
            self.spark_kills_owed += 1  # killed mid-batch: when a run's checkpoint shows a batch under way
        return []

    def restart(self, what: str, i: int) -> list[tuple[float, str, int]]:
        """Restart what a fault stopped (or try a cut again); what to do later."""
        if what == "cut":
            return self.inject(Fault(self.now(), "cut", i, 0.0))
        if what == "producer" and not self.producers[i].alive():
            self.start_producer(i)
        elif what == "hub" and self.hub is not None and not self.hub.alive():
            self.start_hub()
        elif what == "sshd" and self.sshd is not None and self.sshd.process is None:
            self.sshd.resume()
        return []

    def sample(self, t: float) -> None:
        res = process_resources(self.hub.popen.pid) if self.hub is not None and self.hub.alive() else None  # type: ignore[union-attr]
        if res is not None:
            self.tally.samples.append({"t": round(t, 1), "journals": hub_journals(self.hub_root),
                                       "acked": len(self.acks.acked), "behind": self.latency.behind(),
                                       "hub_run": len(self.hub_logs), **res})  # fmt: skip

    def checkpoint(self, complete: bool) -> list[str]:
        ids, _, _ = check.output_rows(self.out)
        problems = check.exactly_once(self.acks.acked, ids, complete=False)
        problems += check.hub_is_prefix(self.producer_root, self.hub_root, CLIENT)
        self.tally.checkpoints.append({"t": round(self.now(), 1), "rows": sum(ids.values()), "problems": problems})
        self.tally.problems += problems
        return problems

    # -- the end -----------------------------------------------------------------------------------------

    def finish(self) -> dict[str, Any]:
        """Faults stop; producers stop; the hub must catch up; a last streaming run; every check."""
        plan = self.plan
        if self.sshd is not None and self.sshd.process is None:
            self.sshd.resume()
        if self.hub is None or not self.hub.alive():
            self.start_hub()
        quiet = self.now()
        self.quiet = True
        for p in self.producers:
            p.kill(signal.SIGTERM)
        for p in self.producers:
            assert p.popen is not None
            p.popen.wait(scaled(60))
        self.latency.add(self.acks.read())
        deadline = time.monotonic() + scaled(plan.catch_up)
        left = check.stuck(self.producer_root, self.hub_root, CLIENT)
        while left and time.monotonic() < deadline:
            self.tick(self.now())
            time.sleep(TICK)
            left = check.stuck(self.producer_root, self.hub_root, CLIENT)
        caught_up = self.now() - quiet
        self.tally.problems += [f"stuck: {s}" for s in left]
        if self.spark is not None:  # the run under way ends by itself; the faults are over
            self.spark_kills_owed = 0
            self.spark.popen.wait(scaled(900))  # type: ignore[union-attr]
            self.spark_ended(self.now())
        for name, job in list(self.jobs.items()):
            if job.popen is not None:
                self.finished_job(name, job)
        self.jobs.clear()
        self.start_spark("stream")  # the last run reads everything the hub has
        assert self.spark is not None and self.spark.popen is not None
        self.spark.popen.wait(scaled(900))
        last = Path(self.spark.log).read_text(errors="replace")
        spark_rows = [int(line.split()[1]) for line in last.splitlines() if line.startswith("rows ")]
        if self.spark.popen.returncode != 0:
            self.tally.problems.append(f"the last streaming run exited {self.spark.popen.returncode}: {last[-2000:]}")
        self.spark = None
        # As cron goes on: the archive, then retention at the hub behind both readers; checked below.
        self.start_spark("archive")
        self.spark.popen.wait(scaled(900))  # type: ignore[union-attr]
        self.spark_ended(self.now())
        self.run_job("hub-retention", self.hub_retention())
        self.finished_job("hub-retention", self.jobs.pop("hub-retention"))
        ids, offsets, ingested = check.output_rows(self.out)
        self.tally.problems += check.exactly_once(self.acks.acked, ids, complete=True)
        if spark_rows and spark_rows[-1] != sum(ids.values()):
            self.tally.problems.append(f"Spark counts {spark_rows[-1]} rows, the sink's log {sum(ids.values())}")
        self.tally.problems += check.hub_is_prefix(self.producer_root, self.hub_root, CLIENT)
        for journal, first, last_offset in self.tally.hub_deleted:  # deleted at the hub: read by the query first
            have = offsets.get(os.path.basename(journal), set())
            lost = [o for o in range(first, last_offset + 1) if o not in have]
            if lost:
                self.tally.problems.append(f"hub retention deleted {journal} offsets {first}-{last_offset}; "
                                           f"{len(lost)} of them never reached the query, first {lost[0]}")  # fmt: skip
        self.tally.problems += self.health()
        self.tally.problems += [f"log: {p}" for p in check.unrecovered(self.hub_logs)]
        self.tally.problems += self.tally.spark_failed
        for sample in self.tally.samples:  # open files net of the kept journals' (new ones may still appear)
            sample["files_net"] = sample["files"] - check.FILES_PER_JOURNAL * sample["journals"]
        for key, slack in (("rss_kib", 0.25), ("files_net", 0.1), ("watches", 0.1)):
            grew = check.flat(self.tally.samples, key, slack)
            if grew:
                self.tally.problems.append(grew)
        self.tally.problems += check.bounded(self.tally.samples, WORKERS)
        acked_at = {m: a[2] for m, a in self.acks.acked.items()}
        to_parquet = sorted(at - acked_at[m] for m, at in ingested if m in acked_at)
        return {
            "plan": asdict(plan),
            "faults": self.tally.faults,
            "acknowledged": len(self.acks.acked),
            "rows": sum(ids.values()),
            "journals": len(os.listdir(self.producer_root)),
            "spark_runs": self.tally.spark_runs,
            "archive_runs": self.tally.archive_runs,
            "retention_runs": self.tally.retention_runs,
            "deleted_segments": {"producer": len(self.tally.producer_deleted), "hub": len(self.tally.hub_deleted)},
            "caught_up_seconds": round(caught_up, 1),
            "append_to_hub": _quantiles(sorted(self.latency.seconds)),
            "append_to_parquet": _quantiles(to_parquet),
            "checkpoints": self.tally.checkpoints,
            "samples": self.tally.samples,
            "problems": self.tally.problems,
        }

    def health(self) -> list[str]:
        """The daemon, healed: /health answers 200 and `sej hub status --max-lag 0` exits 0."""
        problems = []
        deadline = time.monotonic() + scaled(60)
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/health", timeout=scaled(5)) as r:
                    code, body = r.status, r.read()
            except urllib.error.HTTPError as e:
                code, body = e.code, e.read()
            except OSError as e:
                code, body = 0, str(e).encode()
            if code == 200 or time.monotonic() > deadline:
                break
            time.sleep(TICK)
        if code != 200:
            problems.append(f"/health answered {code}: {body[:300]!r}")
        st = subprocess.run(self.py("-m", "sej.apps.cli", "hub", "status", self.hub_root, "--max-lag", "0"),
                            capture_output=True, text=True, timeout=scaled(60))  # fmt: skip
        if st.returncode != 0:
            problems.append(f"sej hub status exited {st.returncode}: {(st.stdout + st.stderr)[-1000:]}")
        return problems

    def stop(self) -> None:
        for p in [*self.producers, self.hub, self.spark, *self.jobs.values()]:
            if p is not None:
                p.kill()
        if self.sshd is not None:
            self.sshd.stop()


def _mid_batch(checkpoint: str) -> bool:
    """A micro-batch is planned (its offsets logged) and not committed yet."""
    try:
        planned = {int(n) for n in os.listdir(os.path.join(checkpoint, "offsets")) if n.isdigit()}
        done = {int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit()}
    except FileNotFoundError:
        return False
    return bool(planned - done)


def _next_offset(journal: str) -> int:
    import sej

    return sej.next_offset(journal) if os.path.isdir(os.path.join(journal, "jnl")) else 0


def _quantiles(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"n": 0}
    pick = lambda q: round(values[min(len(values) - 1, int(q * len(values)))], 3)  # noqa: E731
    return {"n": len(values), "p50": pick(0.5), "p99": pick(0.99), "max": round(values[-1], 3)}
