"""`python -m sej.apps.cli`: the same as the `sej` console script."""

from __future__ import annotations

from .main import main

if __name__ == "__main__":
    main()
