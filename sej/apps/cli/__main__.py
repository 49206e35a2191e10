"""`python -m sej.apps.cli`: the same as the `sej` console script."""

from __future__ import annotations

from ..entry import run

if __name__ == "__main__":
    run("sej.apps.cli.main")
