"""The project around the code: layout, README commands, packaging, public API."""

from __future__ import annotations

import re
from pathlib import Path

import sej

REPO = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- setup-commands -->\s*```(?:sh|bash|console)?\n(.*?)```", text, re.S)
    assert block, "README has the set-up commands block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one() -> None:
    cmds = readme_commands()
    assert len(cmds) == 2
    ci = (REPO / ".ci" / "run").read_text()
    assert cmds[1] in ci.splitlines(), "the README's test command is the one .ci/run runs"


def test_no_top_level_package_shadows_the_standard_library() -> None:
    for name in ("cmd", "hub", "shard"):
        assert not (REPO / name).exists(), f"{name} must live under sej/, not at the top level"


def test_typed_package_and_public_api() -> None:
    assert (REPO / "sej" / "py.typed").exists()
    for name in sej.__all__:
        assert hasattr(sej, name), name
    assert issubclass(sej.InvalidArgumentError, ValueError)
    for err in (sej.LockedError, sej.CorruptionError, sej.TruncatedError, sej.OffsetOutOfRangeError):
        assert issubclass(err, sej.SejError)
