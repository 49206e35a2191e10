"""The README's main job runs and reads back everything it wrote."""

from __future__ import annotations

import subprocess
import sys

from .conftest import REPO


def test_demo_main_job(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sej.demo", "--dir", str(tmp_path / "j"), "--messages", "700", "--segment-size", "8192"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert "read 700 of 700 messages" in out.stdout
    assert "reader offset committed at 700" in out.stdout
