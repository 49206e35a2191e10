"""A real Spark standalone cluster on 127.0.0.1: a master and workers as separate processes (helper module).

    with SparkCluster(workers=2, env={"PYTHONPATH": repo}, client_conf={...}) as cluster:
        cluster.master_url        # spark://127.0.0.1:PORT, for spark_session(..., master) or sej-archive --master
        cluster.client_env()      # the environment for a driver process (SPARK_CONF_DIR with client_conf, ...)
        cluster.state()           # the master's /json/ (workers, applications)

The daemons are started with ``bin/spark-class`` of the PySpark installation (SPARK_HOME is the pyspark
package directory, which holds bin/ and jars/): ``org.apache.spark.deploy.master.Master`` and one
``org.apache.spark.deploy.worker.Worker`` per worker, each with ``--cores`` and ``--memory``. Every port is
chosen by the kernel (``--port 0``, ``--webui-port 0``) and read back from the master's log, so nothing races
for a port and two clusters can run at once; the master's REST submission server (a fixed port 6066, on by
default in Spark 4) is turned off. Everything listens on 127.0.0.1 (``--host`` and SPARK_LOCAL_IP, which the
web UIs bind to), and everything lives in a fresh temporary directory: the logs, each worker's work directory
(its executors' stdout and stderr), Spark's local directories and the configuration directory.

Executors are children of their worker's JVM and inherit its environment: ``env`` (e.g. PYTHONPATH, so that
the executors' Python workers import this checkout's sej) is given to the daemons for that reason. Clients
(drivers) read ``client_conf`` from ``spark-defaults.conf`` in the directory ``client_env()`` names as
SPARK_CONF_DIR; the daemons read their own properties file.

Stopping (``stop()``, also on ``__exit__`` and when starting fails; ``stop_processes()`` for any process tree,
such as a driver's) is by pid, never by name: each daemon runs in its own process group (its executors join
it; PySpark's daemon makes its own group), and the daemons, their groups and every descendant (found through
/proc before any signal) get SIGTERM, then SIGKILL after STOP_TIMEOUT. ``stop()`` returns the pids still alive
after that (``leftover``; normally none). With setpriv, each daemon also gets SIGTERM when the process that
started it dies without cleaning up.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from .sshd import descendants, pdeathsig_prefix
from .timing import scaled

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"

# Deadlines only (every wait ends as soon as its event happens), scaled for loaded machines (testing/timing.py).
START_TIMEOUT = scaled(60.0)  # seconds for the master to be up, then for every worker to be ALIVE on it
STOP_TIMEOUT = scaled(10.0)  # seconds between SIGTERM and SIGKILL, and for the killed processes to be gone
HTTP_TIMEOUT = scaled(5.0)  # one request to a web UI's JSON

# What the daemons read (--properties-file): no REST submission server, so no fixed port.
DAEMON_CONF = {"spark.master.rest.enabled": "false"}


class SparkClusterError(RuntimeError):
    """The cluster could not be started; the message includes the daemons' logs."""


def spark_home() -> str | None:
    """The PySpark installation's directory (it has bin/spark-class and jars/), or None without PySpark."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(next(iter(spec.submodule_search_locations)))


def cluster_available() -> str | None:
    """None if a standalone cluster can be started here, else the reason why not."""
    home = spark_home()
    if home is None:
        return "PySpark is not installed"
    if not os.access(os.path.join(home, "bin", "spark-class"), os.X_OK):
        return f"{home}/bin/spark-class is missing or not executable"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "Java is not installed"
    return None


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot; /proc/PID/stat field 22), None if it is gone or a zombie.

    A pid is only signalled while its start time is the one recorded, so a reused pid is never hit.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # from field 3 (state) on
    if len(fields) < 20 or fields[0] == b"Z":
        return None
    return int(fields[19])


def _write_properties(path: Path, conf: dict[str, str]) -> None:
    path.write_text("".join(f"{k} {v}\n" for k, v in conf.items()))


def stop_processes(popens: list[subprocess.Popen[Any]], timeout: float = STOP_TIMEOUT) -> list[int]:
    """Stop each process, its process group and every process below it; the pids still alive at the end.

    Each process must have been started with start_new_session=True (its group's id is its pid). Every
    descendant is found through /proc first, since a process whose parent dies moves out of the tree. Then
    SIGTERM to each group and each process seen, up to `timeout` seconds for them to end, SIGKILL to what is
    left, and up to `timeout` seconds more for those to be gone. A pid is signalled only while its start time
    is the one seen, so a pid that the kernel has given to a new process meanwhile is never hit.
    """
    seen: dict[int, int] = {}
    for popen in popens:
        for pid in [popen.pid, *descendants(popen.pid)]:
            t = _start_time(pid)
            if t is not None:
                seen[pid] = t

    def alive() -> list[int]:
        return [pid for pid, t in seen.items() if _start_time(pid) == t]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for popen in popens:
            if popen.poll() is None:
                try:
                    os.killpg(popen.pid, sig)  # the process and what stayed in its group (a worker's executors)
                except ProcessLookupError:
                    pass
        for pid in alive():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        for popen in popens:  # reap our own children, so that they do not stay zombies
            try:
                popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not alive():
            break
    return alive()


class Process:
    """One daemon: its Popen, its log file and what it is ('master', 'worker-1', ...)."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self.name, self.popen, self.log_path = name, popen, log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


class SparkCluster:
    """A running standalone master and `workers` workers on 127.0.0.1, each worker with `cores` and `memory`.

    Attributes: master_url (spark://127.0.0.1:PORT), webui_url (http://127.0.0.1:PORT, the master's UI),
    dir (the temporary directory), conf_dir (the clients' SPARK_CONF_DIR), master and workers (Process).
    """

    def __init__(
        self,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        *,
        env: dict[str, str] | None = None,
        client_conf: dict[str, str] | None = None,
    ) -> None:
        reason = cluster_available()
        if reason is not None:
            raise SparkClusterError(reason)
        self.home = str(spark_home())
        self.n_workers, self.cores, self.memory = workers, cores, memory
        self.dir = Path(tempfile.mkdtemp(prefix="sej-spark-cluster-"))
        self.conf_dir = self.dir / "conf"
        self.local_dir = self.dir / "local"
        for d in (self.conf_dir, self.local_dir):
            d.mkdir()
        _write_properties(self.conf_dir / "spark-defaults.conf", dict(client_conf or {}))
        self.daemon_conf = self.dir / "daemon.conf"
        _write_properties(self.daemon_conf, DAEMON_CONF)
        self.env = dict(os.environ) | dict(env or {}) | self._spark_env()
        self.master: Process | None = None
        self.workers: list[Process] = []
        self.master_url = ""
        self.webui_url = ""
        self.leftover: list[int] = []
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _spark_env(self) -> dict[str, str]:
        return {
            "SPARK_HOME": self.home,
            "SPARK_CONF_DIR": str(self.conf_dir),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_LOCAL_DIRS": str(self.local_dir),
        }

    def client_env(self) -> dict[str, str]:
        """Environment variables for a driver process of this cluster (merge them into os.environ)."""
        return self._spark_env()

    # -- life cycle ------------------------------------------------------------------------------------

    def _spawn(self, name: str, *args: str) -> Process:
        log_path = self.dir / f"{name}.log"
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                [*pdeathsig_prefix(), os.path.join(self.home, "bin", "spark-class"), *args,
                 "--properties-file", str(self.daemon_conf)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.dir,
                start_new_session=True,
            )  # fmt: skip
        return Process(name, popen, log_path)

    def _start(self) -> None:
        self.master = self._spawn("master", MASTER_CLASS, "--host", HOST, "--port", "0", "--webui-port", "0")
        master_re = re.compile(r"Starting Spark master at (spark://\S+)")
        ui_re = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")
        url = ui = None
        deadline = time.monotonic() + START_TIMEOUT
        while url is None or ui is None:
            self._check_alive(deadline, "the master to log its URL and its web UI's port")
            log = self.master.log
            m, u = master_re.search(log), ui_re.search(log)
            url, ui = (m.group(1) if m else None), (u.group(1) if u else None)
        self.master_url, self.webui_url = url, f"http://{HOST}:{ui}"
        while self._state_or_none().get("status") != "ALIVE":
            self._check_alive(deadline, "the master's status ALIVE in its /json/")
        for i in range(1, self.n_workers + 1):
            work = self.dir / f"work-{i}"
            work.mkdir()
            self.workers.append(
                self._spawn(f"worker-{i}", WORKER_CLASS, self.master_url, "--host", HOST, "--cores", str(self.cores),
                            "--memory", self.memory, "--webui-port", "0", "--work-dir", str(work))
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while self.alive_workers() < self.n_workers:
            self._check_alive(deadline, f"{self.n_workers} ALIVE workers in the master's /json/")

    def _check_alive(self, deadline: float, what: str) -> None:
        """Between two polls: fail with the logs if a daemon died or the deadline passed; else pause briefly."""
        for p in self.processes():
            code = p.popen.poll()
            if code is not None:
                raise SparkClusterError(f"the {p.name} exited with code {code} while waiting for {what}\n{self.logs()}")
        if time.monotonic() > deadline:
            raise SparkClusterError(f"timed out waiting for {what}\n{self.logs()}")
        time.sleep(0.1)

    def processes(self) -> list[Process]:
        return ([self.master] if self.master else []) + self.workers

    def stop(self) -> list[int]:
        """Stop the workers (and with them their executors) and the master; remove the directory.

        Returns (and keeps in `leftover`) the pids of the cluster's processes still alive after SIGKILL: none,
        unless something is badly wrong.
        """
        try:
            procs = [*reversed(self.workers), *([self.master] if self.master else [])]
            self.leftover = stop_processes([p.popen for p in procs])
        finally:
            self.workers, self.master = [], None
            shutil.rmtree(self.dir, ignore_errors=True)
        return self.leftover

    def __enter__(self) -> SparkCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- for tests -------------------------------------------------------------------------------------

    def _get_json(self, url: str) -> dict[str, Any]:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as r:  # noqa: S310 (http://127.0.0.1 only)
            return dict(json.load(r))

    def _state_or_none(self) -> dict[str, Any]:
        try:
            return self.state()
        except (OSError, ValueError):  # not listening yet, or a partial answer
            return {}

    def state(self) -> dict[str, Any]:
        """The master's state: its web UI's /json/ (workers, activeapps, completedapps, ...)."""
        return self._get_json(self.webui_url + "/json/")

    def worker_states(self) -> list[dict[str, Any]]:
        """Each ALIVE worker's own /json/ (executors, finishedexecutors with their appid, ...)."""
        return [self._get_json(w["webuiaddress"] + "/json/") for w in self.state()["workers"] if w["state"] == "ALIVE"]

    def alive_workers(self) -> int:
        return sum(1 for w in self._state_or_none().get("workers", []) if w.get("state") == "ALIVE")

    def logs(self, tail: int = 60) -> str:
        """The last `tail` lines of each daemon's log, and of each executor's stderr."""
        parts = []
        for p in self.processes():
            parts.append(f"--- {p.name} log ({p.log_path}):\n" + "\n".join(p.log.splitlines()[-tail:]))
        for path in sorted(self.dir.glob("work-*/*/*/stderr")):
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- executor stderr ({path}):\n" + "\n".join(lines))
        return "\n".join(parts)

    def __repr__(self) -> str:
        return f"SparkCluster({self.master_url or 'not started'}, {len(self.workers)} workers, dir={self.dir})"
