"""The Source protocol's capabilities are declared on it, and every source and wrapper provides them (issue 39).

The bug this guards against: the daemon's watched source forwarded `remote` and `reads_seen` but not `round_trip`,
so under sej-hub the probe of a far producer took two round trips instead of one (found by reading; the probe's
own test used a wrapper of its own). These tests run the daemon against a real sshd behind a real delay (testing/wan).
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import sej
from sej.hub import daemon
from sej.hub.batch import PROBE_TOGETHER_RTT, Prefetched
from sej.hub.config import ClientConfig, load_config
from sej.hub.daemon import Hub
from sej.hub.local_source import LocalSource
from sej.hub.sftp_source import SftpSource
from sej.hub.source import Source
from sej.offset import read_offset_file
from testing.wan import Wan

if TYPE_CHECKING:
    from testing.sshd import Sshd

CAPABILITIES = sorted(n for n in vars(Source) if not n.startswith("_"))


def test_the_protocol_declares_the_capabilities_the_engine_uses() -> None:
    assert {"remote", "reads_seen", "round_trip", "defers_commit", "broken", "sums_mark", "keep_handles", "forget",
            "tidy"} <= set(CAPABILITIES)  # fmt: skip


def far_config(tmp_path: Path, sshd: Sshd, wan: Wan, src: Path) -> Any:
    """A hub.toml with one client reached through `wan` (its known_hosts names the proxy's port)."""
    known = tmp_path / "known_hosts_wan"
    known.write_text(f"[127.0.0.1]:{wan.port} {sshd.host_key}\n")
    conf = tmp_path / "hub.toml"
    # Over SFTP: where the hub can choose `sej serve` (issue 39, 2), it is told not to (this sej is on the producer).
    sftp = 'transport = "sftp"\n' if "transport" in {f.name for f in fields(ClientConfig)} else ""
    conf.write_text(
        f'hub_root = "{tmp_path / "hub"}"\n\n[[client]]\nclient_id = "far"\nhost = "127.0.0.1"\nport = {wan.port}\n'
        f'user = "{sshd.user}"\nidentity_file = "{sshd.identity}"\nknown_hosts = "{known}"\nremote_root = "{src}"\n'
        + sftp
    )
    return load_config(conf)


def produce(src: Path, journals: int) -> None:
    with sej.ShardedWriter(str(src), "ev", shard_bit=2, hash=lambda k: k[0] % journals) as w:
        for k in range(journals):
            w.append(b"m%d" % k, key=bytes([k]))


def test_every_source_the_daemon_uses_has_every_capability(tmp_path: Path, sshd: Sshd) -> None:
    """LocalSource, SftpSource, a pass's Prefetched and the daemon's watched sources: each has every member the
    protocol declares, with the value of the source it wraps."""
    src = tmp_path / "src"
    produce(src, 2)
    local = LocalSource(str(src))
    assert [c for c in CAPABILITIES if not hasattr(local, c)] == []
    with Wan(sshd.port, rtt=0.010) as wan:
        config = far_config(tmp_path, sshd, wan, src)
        seen: list[Source] = []
        with Hub(config) as hub:
            original = daemon._Watched.__init__

            def spy(self: Any, *args: Any) -> None:  # every argument of _Watched, whichever it takes
                original(self, *args)
                seen.append(self)

            daemon._Watched.__init__ = spy  # type: ignore[method-assign]
            try:
                (report,) = hub.run_once()
            finally:
                daemon._Watched.__init__ = original  # type: ignore[method-assign]
            assert report.ok, report.failures()
            assert seen
            for watched in seen:
                assert [c for c in CAPABILITIES if not hasattr(watched, c)] == []
                inner = watched.src  # type: ignore[attr-defined]
                assert isinstance(inner, SftpSource)
                assert watched.round_trip == inner.round_trip >= 0.010
                assert watched.reads_seen is inner.reads_seen is True
                assert watched.remote is True and watched.broken is False
    pre = Prefetched(lambda: local, None, {}, None, lister=local)
    assert [c for c in CAPABILITIES if not hasattr(pre, c)] == []
    assert pre.defers_commit is True and pre.round_trip == 0.0


def test_under_sej_hub_a_far_producer_s_idle_probe_takes_one_round_trip(
    tmp_path: Path, sshd: Sshd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a link with a round trip above PROBE_TOGETHER_RTT, an idle pass of sej-hub's daemon probes each
    journal's last segment and its successor in one batch of requests (one round trip), not two batches."""
    src = tmp_path / "src"
    produce(src, 4)
    batches: list[list[tuple[Any, ...]]] = []
    many = SftpSource.many

    def spy(self: SftpSource, calls: list[tuple[Any, ...]]) -> list[Any]:
        batches.append(list(calls))
        return many(self, calls)

    monkeypatch.setattr(SftpSource, "many", spy)
    with Wan(sshd.port, rtt=max(0.020, 4 * PROBE_TOGETHER_RTT)) as wan:
        config = far_config(tmp_path, sshd, wan, src)
        with Hub(config) as hub:
            (first,) = hub.run_once()
            assert first.ok and first.messages == 4, first.failures()
            batches.clear()
            (idle,) = hub.run_once()
    assert idle.ok and idle.messages == 0
    probes = [b for b in batches if b and all(c[0] == "size" for c in b)]
    assert len(probes) == 1, probes  # one round trip for the probe of every journal
    (probe,) = probes
    assert len(probe) == 8 and len({c[1] for c in probe}) == 4  # two lstats per journal, together
    assert os.path.isdir(tmp_path / "hub")


def test_a_far_copy_opens_its_workers_channels_ahead_and_closes_every_one(tmp_path: Path, sshd: Sshd) -> None:
    """copy_all over SFTP through a link of +20 ms (sej copy's way: new sources per pass) opens its workers' channels
    while it lists; initial, incremental and idle passes copy exactly what the producer has, commit it there, and
    leave no channel open on the connection."""
    from sej.hub import CopyState, copy_all
    from sej.hub.ssh import connect, resolve, sftp_sources

    src, hub = tmp_path / "src", tmp_path / "hub"
    produce(src, 4)
    state = CopyState()
    with Wan(sshd.port, rtt=0.020) as wan:
        known = tmp_path / "known_hosts_wan"
        known.write_text(f"[127.0.0.1]:{wan.port} {sshd.host_key}\n")
        ep = resolve("127.0.0.1", wan.port, sshd.user, str(sshd.identity), str(known), ssh_config=os.devnull)
        for round_ in range(3):
            if round_ == 1:
                produce(src, 4)  # one more message in every journal
            client = connect(ep)
            try:
                made: list[SftpSource] = []
                make = sftp_sources(client, str(src), "far")

                def counted(made: list[SftpSource] = made, make: Any = make) -> Source:
                    made.append(make())
                    return made[-1]

                out = copy_all(counted, str(hub), "c", "hub", workers=3, state=state)
                assert all(o.error is None for o in out), [o.error for o in out]
                assert sum(o.result.messages for o in out if o.result) == (4 if round_ < 2 else 0)
                assert len(made) == 4  # the lister and the workers' three, opened ahead even when idle
                transport = client.get_transport()
                assert transport is not None
                # paramiko's channels: every one closed by the pass (the server's replies may be on the way)
                assert all(c.closed for c in transport._channels.values())
            finally:
                client.close()
    for j in sorted(p.name for p in src.iterdir()):
        assert sej.next_offset(str(hub / f"c.{j}")) == sej.next_offset(str(src / j)) == 2
        assert read_offset_file(str(src / j / "ofs" / "hub.ofs")) == 2  # committed on the producer
