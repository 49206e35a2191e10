"""sej-hub's HTTP endpoint: /metrics in Prometheus text format (prometheus_client) and /health.

Nothing is counted on the copy path: the metrics are built from the hub's StatusBook when
Prometheus scrapes them, so a hub without scrapers pays nothing, and one with them pays per
scrape. /health answers 200 while every client had a successful pass within `max_age` seconds,
else 503 with a JSON body naming the stale clients.

prometheus_client is imported only when the endpoint is started (hub.toml's metrics_listen).
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from socketserver import TCPServer, ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from .status import PASS_BUCKETS, StatusBook

log = logging.getLogger("sej.hub")

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class HubCollector:
    """The hub's metrics, per client and journal, read from a StatusBook at each scrape."""

    def __init__(self, book: StatusBook, max_age: float | None = None) -> None:
        self.book = book
        self.max_age = max_age  # /health's, exported so that an alert rule can compare with the same age

    def describe(self) -> list[Any]:
        return []  # no collect() at registration: the families are built per scrape

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        now = self.book.clock()
        cj, c = ["client", "journal"], ["client"]
        messages = CounterMetricFamily("sej_hub_copied_messages", "Messages copied since the hub started.", labels=cj)
        nbytes = CounterMetricFamily("sej_hub_copied_bytes", "Bytes copied since the hub started.", labels=cj)
        hub_next = GaugeMetricFamily("sej_hub_next_offset", "The hub's next offset of the journal.", labels=cj)
        producer_next = GaugeMetricFamily(
            "sej_hub_producer_next_offset",
            "The producer's next offset as the last pass saw it (exact when it copied all it saw).",
            labels=cj,
        )
        lag = GaugeMetricFamily("sej_hub_lag_messages", "Messages the hub was behind when the last pass looked.",
                                labels=cj)  # fmt: skip
        lag_bytes = GaugeMetricFamily("sej_hub_lag_bytes", "Bytes the hub was behind when the last pass looked.",
                                      labels=cj)  # fmt: skip
        failing = GaugeMetricFamily("sej_hub_journal_failing", "1 if the journal's last copy failed.", labels=cj)
        age = GaugeMetricFamily(
            "sej_hub_seconds_since_success",
            "Seconds since the client's last pass without failures (or bytes written by the pass under way).",
            labels=c,
        )
        last = GaugeMetricFamily(
            "sej_hub_last_success_timestamp_seconds", "When the client's last successful pass ended.", labels=c
        )
        connected = GaugeMetricFamily("sej_hub_connected", "1 while the client's connection is open.", labels=c)
        errors = CounterMetricFamily(
            "sej_hub_errors", "Errors since the hub started, by kind.", labels=["client", "kind"]
        )
        passes = HistogramMetricFamily("sej_hub_pass_duration_seconds", "How long the client's passes took.", labels=c)
        max_age = GaugeMetricFamily("sej_hub_health_max_age_seconds",
                                    "/health's max age: a client without a good pass for longer is stale.")  # fmt: skip
        if self.max_age is not None:
            max_age.add_metric([], self.max_age)
        for s in self.book.snapshot():
            cid = s.client_id
            age.add_metric([cid], s.age(now))
            if s.last_success is not None:
                last.add_metric([cid], s.last_success)
            connected.add_metric([cid], 1.0 if s.connected else 0.0)
            for kind, n in sorted(s.errors.items()):
                errors.add_metric([cid, kind], n)
            cumulative, buckets = 0, []
            for bound, n in zip(PASS_BUCKETS, s.pass_buckets, strict=True):
                cumulative += n
                buckets.append((repr(bound), cumulative))
            buckets.append(("+Inf", s.passes))
            passes.add_metric([cid], buckets, s.pass_seconds_sum)
            for name, j in sorted(s.journals.items()):
                labels = [cid, name]
                messages.add_metric(labels, j.messages)
                nbytes.add_metric(labels, j.bytes)
                failing.add_metric(labels, 1.0 if j.error is not None else 0.0)
                if j.hub_next is not None:
                    hub_next.add_metric(labels, j.hub_next)
                if j.producer_next is not None:
                    producer_next.add_metric(labels, j.producer_next)
                if j.lag is not None:
                    lag.add_metric(labels, j.lag)
                if j.lag_bytes is not None:
                    lag_bytes.add_metric(labels, j.lag_bytes)
        yield from (messages, nbytes, hub_next, producer_next, lag, lag_bytes, failing, age, last, connected, errors,
                    passes, max_age)  # fmt: skip


def health(book: StatusBook, max_age: float) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of /health: 503 naming the clients without a successful pass in `max_age` s
    (`stale`), and those whose connection was lost and is not back (`disconnected`, at once: a silent partition
    is found by SSH keepalives within seconds, sej.hub.ssh.KEEPALIVE_DEAD)."""
    stale = book.stale(max_age)
    lost = book.lost()
    if not stale and not lost:
        return 200, {"status": "ok", "max_age": max_age}
    errors = {s.client_id: s.last_error for s in book.snapshot()}
    doc: dict[str, Any] = {
        "status": "stale" if stale else "disconnected",
        "max_age": max_age,
        "stale": [
            # Rounded up: a client stale by less than a millisecond must not read as exactly max_age.
            {"client": cid, "seconds_since_success": math.ceil(a * 1000) / 1000, "last_error": errors.get(cid)}
            for cid, a in stale
        ],  # fmt: skip
    }
    if lost:
        doc["disconnected"] = [{"client": cid, "seconds_since_lost": round(a, 3), "last_error": errors.get(cid)}
                               for cid, a in lost]  # fmt: skip
    return 503, doc


def wsgi_app(book: StatusBook, max_age: float) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(HubCollector(book, max_age))

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            body, ctype, status = generate_latest(registry), CONTENT_TYPE_LATEST, "200 OK"
        elif path == "/health":
            code, doc = health(book, max_age)
            body, ctype = json.dumps(doc).encode() + b"\n", "application/json"
            status = "200 OK" if code == 200 else "503 Service Unavailable"
        else:
            body, ctype, status = b"not found: try /metrics or /health\n", "text/plain", "404 Not Found"
        start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
        return [body]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress never holds up the hub's exit

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the host up in DNS (getfqdn), which can stall the hub's start.
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A scraper that hangs up mid-request: one line at DEBUG, not a traceback on stderr.
        log.debug("metrics endpoint: a request from %s failed", client_address, exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    timeout = 10  # seconds: an idle or slow connection is closed, so scrapers cannot pile up threads

    def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds: not worth a line
        pass


class MetricsServer:
    """/metrics and /health on (host, port), served by a daemon thread until close()."""

    def __init__(self, book: StatusBook, host: str, port: int, max_age: float) -> None:
        cls = _Server6 if ":" in host else _Server
        self._httpd = make_server(host, port, wsgi_app(book, max_age), server_class=cls, handler_class=_QuietHandler)
        self.address: tuple[str, int] = self._httpd.server_address[:2]  # type: ignore[assignment]
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.2,), name="sej-hub-metrics",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


__all__ = ["HubCollector", "MetricsServer", "health", "wsgi_app"]
