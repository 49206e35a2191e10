"""The Prometheus alerting rules `sej-hub --print alerts` writes (sej/apps/files/sej-hub.rules.yml).

promtool checks them, and runs their unit tests (tests/promtool/sej-hub.rules.test.yml, in promtool's own
format) on the rules as printed. Without promtool these tests skip, unless CI is set (tests/conftest.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from sej.apps import hub_files
from sej.hub.status import StatusBook
from testing.timing import scaled

from .conftest import REPO
from .test_hub_files import print_file

UNIT_TESTS = REPO / "tests" / "promtool" / "sej-hub.rules.test.yml"
ALERTS = {
    "SejHubNotScraped",
    "SejHubClientDown",
    "SejHubClientFailing",
    "SejHubLagGrowing",
    "SejHubJournalFailing",
    "SejHubNoSuccessfulPass",
}


def printed_rules(directory: Path) -> Path:
    """`python3 -m sej.apps.hub --print alerts`, written to directory/sej-hub.rules.yml."""
    p = print_file("alerts")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    path = directory / "sej-hub.rules.yml"
    path.write_text(p.stdout)
    return path


def promtool_run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, cwd=cwd, timeout=scaled(60))


def test_sej_hub_print_alerts_writes_the_package_s_rules_whatever_the_config_path() -> None:
    text = print_file("alerts").stdout
    assert text == hub_files.template("alerts")
    assert set(re.findall(r"(?m)^ +- alert: (\w+)$", text)) == ALERTS
    # the rules name no path: a config path the unit would refuse does not matter to them
    p = print_file("alerts", "--config", "/etc/my sej/hub.toml")
    assert p.returncode == 0 and p.stdout == text, p.stderr


def test_promtool_check_rules_accepts_the_printed_rules(tmp_path: Path, promtool: str) -> None:
    rules = printed_rules(tmp_path)
    p = promtool_run(promtool, "check", "rules", rules.name, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in p.stdout, p.stdout


def test_promtool_unit_tests_fire_and_resolve_every_alert_of_the_printed_rules(tmp_path: Path, promtool: str) -> None:
    printed_rules(tmp_path)
    shutil.copy(UNIT_TESTS, tmp_path)  # beside the printed rules, which its rule_files names
    p = promtool_run(promtool, "test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout, p.stdout
    # the unit tests do fail on rules that do not behave: an alert that never fires
    rules = tmp_path / "sej-hub.rules.yml"
    rules.write_text(rules.read_text().replace("sej_hub_journal_failing == 1", "sej_hub_journal_failing == 2"))
    p = promtool_run(promtool, "test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert p.returncode == 1 and "SejHubJournalFailing" in p.stdout + p.stderr, p.stdout + p.stderr


def test_the_unit_tests_see_each_alert_quiet_then_firing_then_resolved() -> None:
    """Within one test group of the unit tests: not firing (or pending), then firing, then not firing again."""
    groups = re.split(r"(?m)^  - interval: ", UNIT_TESTS.read_text())[1:]
    seen: dict[str, list[str]] = {}
    for group in groups:
        cases = re.findall(r"- eval_time: (\d+)m\n +alertname: (\w+)\n +exp_alerts:( \[\])?", group)
        for alert in {name for _, name, _ in cases}:
            states = [("quiet" if empty else "firing") for t, name, empty in sorted(cases, key=lambda c: int(c[0]))
                      if name == alert]  # fmt: skip
            if "firing" in states:
                first, last = states.index("firing"), len(states) - 1 - states[::-1].index("firing")
                assert "quiet" in states[:first] and "quiet" in states[last + 1 :], (alert, states)
                seen.setdefault(alert, []).append("fires and resolves")
    assert set(seen) == ALERTS


def test_the_rules_use_only_metrics_the_hub_exports() -> None:
    from sej.hub.metrics import HubCollector

    exported = {"up"}  # Prometheus's own, per target
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    for family in HubCollector(StatusBook(None, [("a", "/s")]), 30.0).collect():
        exported.update(family.name + s for s in suffixes[family.type])
    exprs = " ".join(re.findall(r"(?m)^ +expr: (.*)$", hub_files.template("alerts")))
    used = set(re.findall(r"\b(sej_hub_\w+|up)\b(?=\s*[{\[)]|\s|$)", exprs))
    assert "sej_hub_health_max_age_seconds" in used and "up" in used
    assert used <= exported, used - exported
