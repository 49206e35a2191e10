"""Spark's Python worker for streaming sources, connecting back before its imports (helper for the spark fixture).

Why: a streaming query starts its source's Python worker on the driver as a "simple worker"
(PythonStreamingSourceRunner -> PythonWorkerFactory.createSimpleWorker), and Spark waits only 10 seconds for
that process to connect back, a constant in Spark 4.x (SPARK-45245) that no configuration changes; the
timeouts Spark does offer (spark.python.authenticate.socketTimeout and the network ones) are raised by the
fixture. The module the worker runs, pyspark.sql.streaming.python_streaming_source_runner, imports pyspark,
numpy and pyarrow before it connects: about half a second of CPU, which on a machine with a load average of
10 or more on 2 cores can take longer than those 10 seconds ("Python worker failed to connect back").

So the spark fixture's PYSPARK_PYTHON (a small shell script) runs this file for that one module, and the
interpreter itself for everything else. This file connects and authenticates the way pyspark does
(pyspark.worker_util.get_sock_file_to_executor: the port or Unix socket and the secret from the environment,
then the process id), without importing anything heavy; then it runs the real module as __main__ with
get_sock_file_to_executor handing over that connection. Everything after the connection is pyspark's own
code, byte for byte the same conversation; only the order (connect, then import) differs, and Spark waits
for what follows without a deadline of its own.

    python spark_worker.py -m pyspark.sql.streaming.python_streaming_source_runner
"""

from __future__ import annotations

import os
import socket
import struct
import sys
from collections.abc import Iterator
from typing import BinaryIO, cast

MODULE = "pyspark.sql.streaming.python_streaming_source_runner"


def _read_exactly(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if data is None or len(data) != n:
        raise EOFError("the JVM closed the connection during authentication")
    return bytes(data)


def connect_back() -> tuple[socket.socket, BinaryIO]:
    """(socket, buffered file) connected and authenticated to the JVM, as pyspark.util.local_connect_and_auth."""
    timeout = int(os.environ.get("SPARK_AUTH_SOCKET_TIMEOUT", 15))
    bufsize = int(os.environ.get("SPARK_BUFFER_SIZE", 65536))
    secret = os.environ.get("PYTHON_WORKER_FACTORY_SECRET")
    path = os.environ.get("PYTHON_WORKER_FACTORY_SOCK_PATH")
    if path is not None and secret is None:  # a Unix domain socket: no secret
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(path)
        return sock, cast(BinaryIO, sock.makefile("rwb", bufsize))
    if secret is None:
        raise RuntimeError("PYTHON_WORKER_FACTORY_SECRET is not set: not started by Spark's PythonWorkerFactory")
    port = int(os.environ["PYTHON_WORKER_FACTORY_PORT"])
    host = "::1" if os.environ.get("SPARK_PREFER_IPV6", "false").lower() == "true" else "127.0.0.1"
    sock = socket.create_connection((host, port), timeout)
    f = cast(BinaryIO, sock.makefile("rwb", bufsize))
    data = secret.encode("utf-8")
    f.write(struct.pack("!i", len(data)) + data)
    f.flush()
    (n,) = struct.unpack("!i", _read_exactly(f, 4))
    reply = _read_exactly(f, n).decode("utf-8") if n >= 0 else None
    if reply != "ok":
        f.close()
        sock.close()
        raise RuntimeError(f"unexpected reply from the JVM while authenticating: {reply!r}")
    return sock, f


def main() -> None:
    if sys.argv[1:3] != ["-m", MODULE]:
        raise SystemExit(f"usage: {sys.argv[0]} -m {MODULE} [args]")
    sock, f = connect_back()
    f.write(struct.pack("!i", os.getpid()))  # as get_sock_file_to_executor: the JVM reads the pid next
    f.flush()

    import contextlib
    import runpy

    sys.path[0] = os.getcwd()  # as `python -m`: the current directory first, not this file's
    import pyspark.worker_util

    @contextlib.contextmanager
    def connected(timeout: float | None = -1) -> Iterator[BinaryIO]:
        if timeout is None or timeout > 0:
            sock.settimeout(timeout)
        try:
            yield f
        finally:
            f.close()

    pyspark.worker_util.get_sock_file_to_executor = connected
    sys.argv = [sys.argv[0], *sys.argv[3:]]
    runpy.run_module(MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
