"""Test infrastructure shared by tests/ and scripts/bench.py; not part of the sej distribution.

It lives at the top of the repository, beside sej/, so that the benchmark can use the sshd fixture
without importing the `tests` package (and its conftest), and outside sej/ so that the wheel does not
ship it (setup.cfg packages only sej and sej.*). Both import it with the repository root on sys.path:
pytest puts it there (`pythonpath = .` in setup.cfg), scripts/bench.py inserts it.

- `testing.sshd`: a real OpenSSH sshd on 127.0.0.1 with fresh host and client keys.
- `testing.wan`: a wide-area link on loopback (a TCP proxy with delay, a bandwidth cap, blackholes and resets).
- `testing.spark_cluster`: a real Spark standalone cluster on 127.0.0.1 (a master and workers, each its own
  process, started with the PySpark installation's bin/spark-class).
"""
