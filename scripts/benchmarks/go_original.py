"""The Go original (github.com/h12w/sej), built from a pinned commit and measured next to sej in benchmark 3.

`build(scratch)` extracts the Go original's source at GO_COMMIT from a git repository holding it (the
directory named by $SEJ_GO_SOURCE: a clone of https://github.com/h12w/sej or its bare git directory;
else the copy this machine's `fetch github:h12w/sej` leaves under /work/.mirror) into
`scratch/go-original/src/h12.io/sej`, and builds in GOPATH mode (GO111MODULE=off; GOPATH is that
directory, then /usr/share/gocode, where Debian's Go library packages put fsnotify and x/sys):

- the package's test binary (`go test -c`), which `bench` runs as `go test -run XXX -bench
  'ScanOnly|Append' -benchtime Nx` would: the Go original's own `BenchmarkAppend` and
  `BenchmarkScanOnly` (13-byte keys, 100-byte values of 'a'; ScanOnly scans a journal it writes
  first, outside its clock);
- go_scan.go (beside this file), which `scan` runs on a journal sej wrote: the Go original's
  Scanner over any shape.

Anything missing (Go, the Debian packages, the source, that commit) raises NotMeasured with the reason,
which benchmark 3 prints in its rows instead of a figure.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

GO_COMMIT = "97b83102313793984459ab1a5e2e3d97c0a8ee6e"  # "move to h12.io", the last commit of h12w/sej
GO_PACKAGES = "golang-1.19-go golang-github-fsnotify-fsnotify-dev golang-github-pkg-errors-dev golang-golang-x-sys-dev"
GOCODE = Path("/usr/share/gocode")  # Debian's GOPATH of Go library packages
SOURCE_ENV = "SEJ_GO_SOURCE"
FETCHED = Path("/work/.mirror/h12w+sej/repo/.git")  # where `fetch github:h12w/sej` puts it on this machine
GO_SCAN = Path(__file__).with_name("go_scan.go")
HOW = (
    f"Go and the libraries it needs: `apt-get install {GO_PACKAGES}` (Debian 12); the source: "
    f"`git clone https://github.com/h12w/sej` (commit {GO_COMMIT[:7]} is built), named by "
    f"`{SOURCE_ENV}=<the clone>`"
)
_BENCH_LINE = re.compile(r"^Benchmark(\w+?)(?:-\d+)?\s+(\d+)\s+([\d.]+) ns/op", re.M)


class NotMeasured(Exception):
    """Why the Go original could not be built or run (a short sentence)."""


@dataclass
class GoOriginal:
    version: str  # `go version`
    package: Path  # the extracted source, where the benchmarks run
    env: dict[str, str]
    test_binary: Path
    scan_binary: Path

    def bench(self, n: int) -> dict[str, float]:
        """One run of the Go original's BenchmarkAppend and BenchmarkScanOnly at b.N = n: ns/op by name."""
        p = self._run([str(self.test_binary), "-test.run", "XXX", "-test.bench", "ScanOnly|Append",
                       "-test.benchtime", f"{n}x"], cwd=self.package)  # fmt: skip
        found = {name: float(ns) for name, count, ns in _BENCH_LINE.findall(p.stdout) if int(count) == n}
        if set(found) != {"Append", "ScanOnly"}:
            raise NotMeasured(f"the Go benchmarks printed no ns/op for b.N = {n}: {_last_line(p.stdout + p.stderr)}")
        return found

    def scan(self, journal: Path, n: int, value_bytes: int) -> float:
        """Seconds the Go original's Scanner takes to read the n messages of `journal` (a sej journal)."""
        p = self._run([str(self.scan_binary), "-n", str(n), str(journal)], cwd=self.package)
        count, total, ns = (int(x) for x in p.stdout.split())
        if (count, total) != (n, value_bytes):
            raise NotMeasured(f"go_scan read {count} messages, {total} value bytes; expected {n}, {value_bytes}")
        return ns / 1e9

    def _run(self, cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(cmd, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=600)
        if p.returncode:
            raise NotMeasured(f"{Path(cmd[0]).name} exited {p.returncode}: {_last_line(p.stdout + p.stderr)}")
        return p


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def find_go() -> str:
    for go in ("/usr/lib/go-1.19/bin/go", shutil.which("go")):
        if go and os.access(go, os.X_OK):
            return go
    raise NotMeasured(f"Go is not installed (`apt-get install {GO_PACKAGES}`)")


def find_source() -> Path:
    named = os.environ.get(SOURCE_ENV)
    if named:
        return Path(named)
    if FETCHED.is_dir():
        return FETCHED
    raise NotMeasured(f"no source of the Go original: set {SOURCE_ENV} to a clone of https://github.com/h12w/sej")


def build(scratch: Path) -> GoOriginal:
    """The Go original's source at GO_COMMIT extracted under `scratch` and built (see the module's doc)."""
    go = find_go()
    if not (GOCODE / "src/gopkg.in/fsnotify.v1").is_dir() or not (GOCODE / "src/golang.org/x/sys/unix").is_dir():
        raise NotMeasured(f"fsnotify or x/sys is missing from {GOCODE} (`apt-get install {GO_PACKAGES}`)")
    source = find_source()
    archive = subprocess.run(["git", "-C", str(source), "archive", "--format=tar", GO_COMMIT], capture_output=True)
    if archive.returncode:
        why = _last_line(archive.stderr.decode(errors="replace"))
        raise NotMeasured(f"commit {GO_COMMIT[:7]} of the Go original is not in {source}: {why}")
    gopath = scratch / "go-original"
    if gopath.exists():
        shutil.rmtree(gopath)
    package = gopath / "src" / "h12.io" / "sej"
    package.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(package, filter="data")
    main = gopath / "src" / "sejbench" / "go_scan"
    main.mkdir(parents=True)
    shutil.copy(GO_SCAN, main / "main.go")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GO")}
    env.update(GO111MODULE="off", GOPATH=f"{gopath}{os.pathsep}{GOCODE}", GOCACHE=str(gopath / "cache"),
               GOENV="off", GOFLAGS="", GOTOOLCHAIN="local")  # fmt: skip
    bin_dir = gopath / "bin"

    def go_cmd(*args: str, cwd: Path = package) -> str:
        p = subprocess.run([go, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        if p.returncode:
            raise NotMeasured(f"`go {' '.join(args)}` failed: {_last_line(p.stdout + p.stderr)}")
        return p.stdout.strip()

    version = go_cmd("version")
    go_cmd("test", "-c", "-o", str(bin_dir / "sej.test"), ".")
    go_cmd("build", "-o", str(bin_dir / "go_scan"), ".", cwd=main)
    return GoOriginal(version, package, env, bin_dir / "sej.test", bin_dir / "go_scan")
