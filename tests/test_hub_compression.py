"""Compression on slow links (issue 39): `compression` per client in hub.toml and `sej copy --compress` ask for SSH's
own zlib, for both transports. Over a real sshd: the copy is byte-identical and zlib was negotiated both ways."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sej
from sej.hub import copy_all
from sej.hub.config import load_config
from sej.hub.location import Origin, open_sources
from testing.sshd import Sshd
from testing.timing import scaled

from .conftest import REPO
from .test_hub_copy import assert_identical, produce
from .test_hub_daemon import write_config
from .test_hub_serve import SERVE

ZLIB = ("zlib@openssh.com", "zlib")


def json_events(root: str, n: int) -> None:
    """n JSON-like access-log events (compressible, as the issue's workload) over 4 journals."""
    with sej.ShardedWriter(root, "p", shard_bit=2, segment_size=64 << 10) as w:
        for i in range(n):
            w.append(b'{"ts": %d, "method": "GET", "path": "/api/v1/items/%d", "status": 200, "bytes": %d, '
                     b'"agent": "Mozilla/5.0 (X11; Linux x86_64)"}' % (1_700_000_000 + i, i % 997, i * 7 % 5000),
                     key=b"k%d" % (i % 40))  # fmt: skip


@pytest.mark.parametrize("transport", ["sftp", "serve"])
@pytest.mark.parametrize("compression", [True, False])
def test_a_compressed_copy_is_byte_identical_and_zlib_was_negotiated(
    sshd: Sshd, tmp_path: Path, transport: str, compression: bool
) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    json_events(src, 5000)
    produce(src, 300, seed=1)  # and some random bytes, which zlib cannot shrink
    origin = Origin(src, "127.0.0.1", sshd.port, sshd.user, str(sshd.identity), str(sshd.known_hosts),
                    transport=transport, serve_command=SERVE, compression=compression)  # fmt: skip
    with open_sources(origin) as sources:
        assert sources.ssh is not None
        t = sources.ssh.get_transport()
        assert t is not None
        out = copy_all(sources, hub, "c1", "hub", workers=4)
        if compression:
            assert t.local_compression in ZLIB and t.remote_compression in ZLIB, (t.local_compression,
                                                                                   t.remote_compression)  # fmt: skip
        else:
            assert t.local_compression == t.remote_compression == "none"
        kind = "ServeSource" if transport == "serve" else "SftpSource"
        assert type(sources()).__name__ == kind
    assert out and all(o.error is None for o in out), [o.error for o in out]
    assert_identical(src, hub)


def test_sej_copy_compress(sshd: Sshd, tmp_path: Path) -> None:
    src = str(tmp_path / "src")
    json_events(src, 2000)
    url = f"ssh://{sshd.user}@127.0.0.1:{sshd.port}{src}"
    env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp_path / "cache"))
    got = subprocess.run([sys.executable, "-m", "sej.apps.cli", "copy", url, str(tmp_path / "hub"), "--identity",
                          str(sshd.identity), "--known-hosts", str(sshd.known_hosts), "--compress", "--transport",
                          "sftp"], capture_output=True, text=True, env=env, timeout=scaled(120))  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert_identical(src, str(tmp_path / "hub"), "127-0-0-1")


SSH = {"client_id": "s", "host": "h", "remote_root": "/r"}


@pytest.mark.parametrize("value,want", [(None, False), (True, True), (False, False)])
def test_config_compression(tmp_path: Path, value: bool | None, want: bool) -> None:
    client: dict[str, Any] = dict(SSH) if value is None else {**SSH, "compression": value}
    config = load_config(write_config(tmp_path / "hub.toml", "/hub", [client]))
    assert config.clients[0].compression is want and config.clients[0].origin.compression is want


@pytest.mark.parametrize("client,expect", [
    ({**SSH, "compression": "yes"}, ["compression = 'yes'", "true or false", "client_id 's'"]),
    ({**SSH, "compression": 1}, ["compression = 1", "true or false"]),
    ({"client_id": "l", "local_root": "/x", "compression": True}, ["compression = True", "local_root"]),
])  # fmt: skip
def test_config_bad_compression_is_named(tmp_path: Path, client: dict[str, Any], expect: list[str]) -> None:
    conf = write_config(tmp_path / "hub.toml", "/hub", [client])
    with pytest.raises(sej.InvalidArgumentError) as e:
        load_config(conf)
    for part in expect:
        assert part in str(e.value), (part, str(e.value))
