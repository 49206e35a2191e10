"""The project around the code: layout, README commands, packaging, public API."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sej
from testing.timing import scaled

from .conftest import IN_CI

REPO = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- setup-commands -->\s*```(?:sh|bash|console)?\n(.*?)```", text, re.S)
    assert block, "README has the set-up commands block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def ci_commands() -> list[str]:
    """The command lines of .ci/run (no comments, no blank lines, continuation lines as they are)."""
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one_last_in_a_fresh_venv() -> None:
    cmds = readme_commands()
    assert len(cmds) == 2
    ci = ci_commands()
    assert ci[-1] == cmds[1], "the README's test command is the last one .ci/run runs"
    # ... as users run it: in a venv made by this run (python3 -m venv DIR), activated just before it
    venv = [i for i, line in enumerate(ci) if re.fullmatch(r'python3 -m venv "(\$\w+/\w+)"', line)]
    assert venv, "no `python3 -m venv` in .ci/run"
    where = re.fullmatch(r'python3 -m venv "(\$\w+/\w+)"', ci[venv[-1]]).group(1)  # type: ignore[union-attr]
    assert ci[venv[-1] + 1 :] == [f'. "{where}/bin/activate"', cmds[1]]
    mktemp = [line for line in ci[: venv[-1]] if line == f"{where.split('/')[0][1:]}=$(mktemp -d)"]
    assert mktemp, "the venv's directory is a fresh temporary one"


def test_ci_runs_the_tests_that_build_venvs_from_the_system_interpreter_too() -> None:
    """The suite runs in a venv (above); the tests that depend on the interpreter's layout run without one too."""
    ci = ci_commands()
    last_venv = max(i for i, line in enumerate(ci) if line.startswith("python3 -m venv "))
    system_runs = [line for line in ci[:last_venv] if line.startswith("python3 -m pytest ")]
    assert len(system_runs) == 1, system_runs
    listed = set(re.findall(r"tests/\w+\.py", system_runs[0]))
    assert all((REPO / f).is_file() for f in listed), listed
    builds_venvs = {f"tests/{p.name}" for p in (REPO / "tests").glob("test_*.py") if '"-m", "venv"' in p.read_text()}
    assert builds_venvs and builds_venvs <= listed, builds_venvs - listed
    assert {"tests/test_hub_files.py", "tests/test_project.py"} <= listed


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


def imported_modules(path: Path) -> set[str]:
    """The absolute names of the modules a module of the sej package imports (relative imports resolved)."""
    package = ".".join(path.relative_to(REPO).parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_the_library_imports_nothing_from_the_applications() -> None:
    """Layers point down: sej, sej.shard, sej.hub and sej.spark never import sej.apps (the programs)."""
    library = [p for p in (REPO / "sej").rglob("*.py") if "apps" not in p.relative_to(REPO / "sej").parts]
    assert len(library) > 20
    for path in library:
        up = sorted(m for m in imported_modules(path) if m == "sej.apps" or m.startswith("sej.apps."))
        assert not up, f"{path.relative_to(REPO)} imports {up}"
    assert not (REPO / "sej" / "cmd").exists() and not (REPO / "sej" / "pipeline.py").exists()


def console_scripts() -> dict[str, str]:
    """The console scripts setup.cfg declares: name -> module:function."""
    cfg = (REPO / "setup.cfg").read_text()
    return dict(
        (name.strip(), target.strip())
        for line in cfg.split("console_scripts =", 1)[1].split("\n[", 1)[0].splitlines()
        if "=" in line and not line.lstrip().startswith("#")
        for name, target in [line.split("=", 1)]
    )


def test_every_program_is_a_console_script_of_sej_apps() -> None:
    # Each through sej.apps.entry (Ctrl-C exits 130 while the program loads), to its module's main().
    assert console_scripts() == {
        "sej": "sej.apps.entry:sej",
        "sej-hub": "sej.apps.entry:hub",
        "sej-hub-cron": "sej.apps.entry:hub_cron",
        "sej-pipeline": "sej.apps.entry:pipeline",
        "sej-retention": "sej.apps.entry:retention",
        "sej-archive": "sej.apps.entry:archive",
    }


def test_every_console_script_is_installed_through_the_entry_module_and_starts() -> None:
    """The installed wrappers (pip's, beside this interpreter) import sej.apps.entry and run their program."""
    scripts = console_scripts()
    if not all((Path(sys.executable).parent / name).is_file() for name in scripts):
        if IN_CI:
            pytest.fail("the console scripts are not installed (python3 -m pip install -e .)")
        pytest.skip("the console scripts are not installed (python3 -m pip install -e .)")
    for name, target in scripts.items():
        script = Path(sys.executable).parent / name
        module, function = target.split(":")
        assert f"from {module} import {function}" in script.read_text(), f"{script} is stale: pip install -e ."
        p = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=scaled(60))
        assert p.returncode == 0 and p.stdout.startswith(f"Usage: {name} "), (name, p.stdout, p.stderr)
