"""A fresh `sej copy` at a distance: what it does while it connects (the hub journals its state knows, opened ahead),
and what it does not import (paramiko's invoke, unless an ssh config runs commands)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import sej
from sej.hub.copy import Destinations
from sej.lock import lock_journal
from testing.timing import scaled

from .conftest import REPO, run_python
from .test_hub_copy import assert_identical, produce
from .test_hub_ssh import ssh_config_home


def sej_copy(sshd, src: str, hub: str, *more: str,  # type: ignore[no-untyped-def]
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "sej.apps.cli", "copy", f"ssh://{sshd.user}@127.0.0.1:{sshd.port}{src}", hub,
         "--client-id", "c1", "--identity", str(sshd.identity), "--known-hosts", str(sshd.known_hosts), *more],
        capture_output=True, text=True, env=env or dict(os.environ, PYTHONPATH=str(REPO)), timeout=scaled(120),
    )  # fmt: skip


def test_open_ahead_keeps_the_hub_journals_open_for_the_copies_and_skips_what_it_cannot_open(tmp_path) -> None:
    hub = tmp_path / "hub"
    for name in ("c1.a", "c1.b", "c1.c"):
        with sej.Writer(str(hub / name)) as w:
            w.append(b"x" * 10)
    busy = sej.Writer(str(hub / "c1.c"))  # another process's writer, say: its lock is not taken from it
    try:
        dests = Destinations(16)
        dirs = [str(hub / n) for n in ("c1.a", "c1.b", "c1.c", "c1.new")]
        assert dests.open_ahead(dirs) == 2  # c1.c is locked, c1.new is no hub journal yet
        assert len(dests) == 2
        a = dests.take(dirs[0])  # the one opened ahead, checked still current
        assert a.ahead is False and a.size == os.path.getsize(hub / "c1.a" / "jnl" / "0000000000000000.jnl")
        dests.give(a)
        dests.close()  # every lock released: a writer may open each journal again
        for d in dirs[:2]:
            lock_journal(d).release()
    finally:
        busy.close()


def test_sej_copy_runs_again_with_a_state_and_a_hub_journal_held_by_another_writer(sshd, tmp_path) -> None:
    """The second and third runs have a state (the hub journals it knows are opened ahead if connecting takes longer
    than FAR_AFTER, as sej serve's start can here). A hub journal another writer holds can neither be opened ahead
    nor copied into, and its copy reports why; the others are copied all the same, and the next run copies it."""
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 400)
    env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp_path / "cache"))
    for transport in ("sftp", "serve"):
        r = sej_copy(sshd, src, hub, "--transport", transport, "--serve-command", f"{sys.executable} -m sej.apps.cli",
                     env=env)  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert_identical(src, hub)
        produce(src, 100, seed=len(transport))
    held = sej.Writer(os.path.join(hub, "c1.p.2.001"))
    try:
        r = sej_copy(sshd, src, hub, "--transport", "sftp", env=env)
    finally:
        held.close()
    assert r.returncode == 1 and "p.2.001: error:" in r.stderr, r.stderr
    r = sej_copy(sshd, src, hub, "--transport", "sftp", env=env)
    assert r.returncode == 0, r.stderr
    assert_identical(src, hub)


def test_paramiko_is_imported_without_invoke() -> None:
    r = run_python("import sys, sej.hub.ssh; print('invoke' in sys.modules, 'paramiko' in sys.modules)")
    assert r.stdout.split() == ["False", "True"], r.stderr


def test_a_match_exec_line_in_the_ssh_config_still_runs_its_command(sshd, tmp_path: Path) -> None:
    """paramiko runs a `Match exec` command with invoke: imported when a config has such a line."""
    marker = tmp_path / "marker"
    home = ssh_config_home(tmp_path, sshd, f'Match host producer-alias exec "test -e {marker}"')
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 100)
    env = dict(os.environ, PYTHONPATH=str(REPO), HOME=str(home))
    cmd = [sys.executable, "-m", "sej.apps.cli", "copy", f"ssh://producer-alias{src}", hub, "--transport", "sftp"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=scaled(120))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr  # the command fails: the entry does not apply
    marker.write_text("")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=scaled(120))
    assert r.returncode == 0, r.stderr
    assert_identical(src, hub, client="producer-alias")


def test_a_far_sej_copy_probes_while_it_lists_and_settles_journals_gone_and_new(sshd, tmp_path: Path) -> None:
    """Through a link of +60 ms, a `sej copy` with a state opens the hub journals it knows while it connects (the
    connection takes longer than FAR_AFTER) and probes them while it lists the root (over SFTP on a worker's channel,
    over sej serve on the same stream). A journal gone since is not reported, a new one is copied whole, the others
    get what they gained: the hub is the producer's copy, over both."""
    from testing.wan import Wan

    src, cache = tmp_path / "src", tmp_path / "cache"
    produce(str(src), 200)
    env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(cache))
    with Wan(sshd.port, rtt=0.060) as wan:
        known = tmp_path / "known_hosts_wan"
        known.write_text(f"[127.0.0.1]:{wan.port} {sshd.host_key}\n")

        def copy(hub: Path, transport: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "sej.apps.cli", "copy", f"ssh://{sshd.user}@127.0.0.1:{wan.port}{src}",
                 str(hub), "--client-id", "c1", "--identity", str(sshd.identity), "--known-hosts", str(known),
                 "--transport", transport, "--serve-command", f"{sys.executable} -m sej.apps.cli"],
                capture_output=True, text=True, env=env, timeout=scaled(120),
            )  # fmt: skip

        hubs = {t: tmp_path / f"hub-{t}" for t in ("sftp", "serve")}
        for transport, hub in hubs.items():
            r = copy(hub, transport)
            assert r.returncode == 0, r.stderr
            assert_identical(str(src), str(hub))
        produce(str(src), 60, seed=3)  # every journal gained messages
        shutil.rmtree(src / "p.2.003")  # but this one is gone (removed by its producer's operator, say)
        with sej.Writer(str(src / "p.3.007")) as w:  # and a new one appeared
            w.append(b"new journal")
        for transport, hub in hubs.items():
            r = copy(hub, transport)
            assert r.returncode == 0, r.stderr
            lines = r.stdout.splitlines()
            assert not any(line.startswith("p.2.003 ") for line in lines), lines
            assert any(line.startswith("p.3.007 -> ") and "1 messages" in line for line in lines), lines
            assert_identical(str(src), str(hub))
