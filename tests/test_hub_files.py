"""The files the wheel carries for a hub (sej/apps/files/), and `sej-hub --print unit|crontab|config|alerts`."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sej.apps import hub_files
from sej.hub.config import loads_config
from testing.timing import scaled

from .conftest import IN_CI, REPO


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO))


def run(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=scaled(30), env=env(), **kw)  # type: ignore[call-overload,no-any-return]


def print_file(*args: str, python: str = sys.executable, **kw: object) -> subprocess.CompletedProcess[str]:
    return run([python, "-m", "sej.apps.hub", "--print", *args], **kw)


def unit_settings(text: str) -> configparser.ConfigParser:
    """The unit as systemd reads its syntax (keys are case-sensitive; no interpolation; repeated keys allowed)."""
    parser = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#", ";"))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return parser


def crontab_line(text: str) -> list[str]:
    (line,) = [x for x in text.splitlines() if x.strip() and not x.startswith("#")]
    return line.split(None, 6)


def test_the_templates_are_package_data_and_every_placeholder_is_filled() -> None:
    for name, filename in hub_files.FILES.items():
        assert (REPO / "sej" / "apps" / "files" / filename).is_file()
        assert hub_files.template(name) == (REPO / "sej" / "apps" / "files" / filename).read_text()
        text = hub_files.render(name, bindir="/opt/sej/bin")
        assert "@" not in re.sub(r"[\w.-]+@[\w.-]+", "", text), text  # no @PLACEHOLDER@ left (user@host is fine)
    cfg = (REPO / "setup.cfg").read_text()
    for filename in hub_files.FILES.values():  # the wheel carries them (.ci/run checks the installed wheel)
        assert f"files/{filename}" in cfg.split("[options.package_data]", 1)[1].split("\n[", 1)[0]


def test_the_unit_is_notify_with_a_watchdog_and_no_restart_loop_on_a_config_error() -> None:
    unit = unit_settings(hub_files.render("unit", bindir="/opt/sej/bin"))
    assert unit.sections() == ["Unit", "Service", "Install"]
    service = unit["Service"]
    assert service["Type"] == "notify" and service["NotifyAccess"] == "main" and int(service["WatchdogSec"]) == 60
    assert service["Restart"] == "on-failure" and service["RestartPreventExitStatus"] == "2"
    assert service["ExecStart"] == "/opt/sej/bin/sej-hub --config /etc/sej/hub.toml"
    assert service["KillSignal"] == "SIGTERM" and int(service["TimeoutStopSec"]) > 30
    assert service["ProtectSystem"] == "strict" and service["ReadWritePaths"] == "/var/lib/sej-hub"
    assert service["NoNewPrivileges"] == "yes" and service["User"] == "sej"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_the_crontab_runs_sej_hub_cron_every_5_minutes() -> None:
    fields = crontab_line(hub_files.render("crontab", config="/srv/hub.toml", bindir="/opt/sej/bin/"))
    assert fields[:6] == ["*/5", "*", "*", "*", "*", "sej"]
    assert fields[6].startswith("/opt/sej/bin/sej-hub-cron --config /srv/hub.toml --max-time 280 >>")


def test_the_example_config_parses_also_with_its_optional_keys() -> None:
    text = hub_files.render("config")
    config = loads_config(text)
    assert [c.client_id for c in config.clients] == ["edge-1", "local-app"] and config.metrics_listen is None
    uncommented = re.sub(r"(?m)^# (metrics_listen|health_max_age|log_format) ", r"\1 ", text)
    assert uncommented != text
    on = loads_config(uncommented)
    assert on.metrics_listen == ("127.0.0.1", 9108) and on.health_max_age == 30.0 and on.log_format == "text"


def test_paths_that_systemd_or_cron_would_split_are_refused() -> None:
    for bad in ("/etc/my sej/hub.toml", "/etc/sej/100%.toml", '/etc/"sej"/hub.toml'):
        with pytest.raises(ValueError, match="plain path"):
            hub_files.render("unit", config=bad, bindir="/opt/sej/bin")
    with pytest.raises(ValueError, match="no file 'bogus'"):
        hub_files.render("bogus")


def test_scripts_dir_is_the_running_script_or_where_pip_puts_console_scripts(tmp_path: Path) -> None:
    script = tmp_path / "bin" / "sej-hub"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    assert hub_files.scripts_dir(str(script)) == str(tmp_path / "bin")
    assert hub_files.scripts_dir(str(tmp_path / "bin" / "other")) in (
        os.path.abspath(sysconfig.get_path("scripts")),
        os.path.abspath(sysconfig.get_path("scripts", f"{os.name}_user")),
    )


def installed(name: str) -> str:
    script = shutil.which(name, path=os.path.dirname(sys.executable))
    if script is None:
        if IN_CI:
            pytest.fail(f"the {name} console script is not installed (python3 -m pip install -e .)")
        pytest.skip(f"the {name} console script is not installed (python3 -m pip install -e .)")
    return script


def test_sej_hub_print_writes_the_files_with_this_installation_s_paths(tmp_path: Path) -> None:
    p = print_file("unit")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    exec_start = unit_settings(p.stdout)["Service"]["ExecStart"].split()
    assert exec_start[1:] == ["--config", "/etc/sej/hub.toml"]
    # run as `python -m sej.apps.hub`: where this interpreter's pip put the console scripts
    assert exec_start[0] == os.path.join(hub_files.scripts_dir(""), "sej-hub")
    script = installed("sej-hub")
    p = run([script, "--config", "hub.toml", "--print", "crontab"], cwd=tmp_path)  # --config first works too
    assert p.returncode == 0, p.stderr
    command = crontab_line(p.stdout)[6].split()
    assert command[:3] == [
        os.path.join(os.path.dirname(script), "sej-hub-cron"),
        "--config",
        str(tmp_path / "hub.toml"),
    ]
    assert os.access(command[0], os.X_OK)
    p = run([script, "--print", "unit"])  # the console script names itself
    assert unit_settings(p.stdout)["Service"]["ExecStart"] == f"{script} --config /etc/sej/hub.toml"
    p = print_file("config")
    assert p.returncode == 0 and loads_config(p.stdout).hub_root == "/var/lib/sej-hub"


def this_interpreter_s_site_dirs() -> list[str]:
    """Where this interpreter finds sej's dependencies: its site-packages (a venv's, and the base's if the venv
    sees them), and the user's."""
    dirs = site.getsitepackages()
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if os.path.isdir(d)]


def test_sej_hub_print_in_a_venv_names_the_venv_s_bin(tmp_path: Path) -> None:
    """A venv's interpreter (sys.prefix is the venv): its bin/, where `pip install` in it puts sej-hub."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=scaled(60))
    python = str(venv / "bin" / "python")
    # The new venv sees the packages this interpreter sees, whether this one is a venv or the system's:
    # --system-site-packages would give it only the base interpreter's, without sej's dependencies when
    # the suite runs in a venv (issue 38). addsitedir also reads their .pth files (editable installs).
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True).stdout.strip()
    lines = [f"import site; site.addsitedir({d!r})\n" for d in this_interpreter_s_site_dirs()]
    Path(purelib, "this-interpreter-s-site.pth").write_text("".join(lines))
    p = run([python, "-c", "import sys, xxhash, click, sej; print(sys.prefix)"])
    assert p.returncode == 0 and p.stdout.strip() == str(venv), p.stderr
    p = print_file("unit", python=python)
    assert p.returncode == 0, p.stderr
    assert unit_settings(p.stdout)["Service"]["ExecStart"] == f"{tmp_path}/venv/bin/sej-hub --config /etc/sej/hub.toml"


def test_sej_hub_print_usage_errors_exit_2() -> None:
    for args, needle in [
        (["bogus"], "'bogus' is not one of 'unit', 'crontab', 'config', 'alerts'"),
        (["unit", "--config", "/etc/my sej/hub.toml"], "has a space"),
        ([], "'--print' requires an argument"),
    ]:
        p = print_file(*args)
        assert p.returncode == 2 and p.stdout == "", (args, p.stdout)
        (line,) = p.stderr.strip().splitlines()
        assert line.startswith("sej-hub: error: ") and needle in line, line
    p = run([sys.executable, "-m", "sej.apps.hub", "--once"])  # without --print, --config is still required
    assert p.returncode == 2 and "Missing option '--config'" in p.stderr
