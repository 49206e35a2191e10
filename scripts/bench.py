#!/usr/bin/env python3
"""Benchmarks of sej against raw CPython baselines, reported as ratios.

This is a benchmark script, not a test. It measures everything in one run and
(re)writes docs/benchmarks.md, which must never be edited by hand.

    python3 scripts/bench.py                 # full run, a few minutes, writes docs/benchmarks.md
    python3 scripts/bench.py --quick         # smaller sizes: a smoke run (figures not representative)
    python3 scripts/bench.py --only sqlite   # one benchmark (repeatable, or comma-separated); the other
                                             # sections of an existing report are kept
    python3 scripts/bench.py --output PATH   # write the report elsewhere
    python3 scripts/bench.py --keep          # keep the scratch journals (bench-data/, git-ignored)
    python3 scripts/bench.py --profile --only append
                                             # pyinstrument report of the sej side of benchmarks 1-3, or of
                                             # read_part for 12 (printed; the report file is not written)

Every message has a 100-byte value and an 8-byte key; the throughput benchmarks (append, append_many,
scan, consumer, spark_read, spark_scale) also run varied sizes and JSON events side by side.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # this checkout's sej, and testing/ (the sshd fixture of benchmarks 10 and 11)

# The benchmarks are the package scripts/benchmarks/ beside this file (the script's directory is sys.path[0]).
from benchmarks.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
