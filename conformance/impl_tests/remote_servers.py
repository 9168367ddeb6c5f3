"""Servers the remote-storage tests start on 127.0.0.1: moto's S3 server and a fault-injecting proxy before it.

Why a proxy of our own: the failures that break week-long jobs (a 500, a reset
connection, a body that stalls or ends early, a flipped byte) must be
produced on demand and counted. :class:`FaultProxy` forwards every request
to the S3 server and, for a GET whose path contains a rule's ``match``,
applies the rule's fault ``times`` times (``-1``: always). With no rule it
is a plain proxy that counts what crossed the wire (``body_bytes``,
``requests``): the remote benchmarks measure every loader's downloads
through it, alike, instead of by each loader's own counters.

Worked example::

    with S3Server() as s3, FaultProxy(s3.url) as proxy:
        proxy.add("tokens-00001", "500", times=1)   # the first GET of that file gets a 500, the next is forwarded
        files = RemoteFiles("s3://bucket/store", tmp, storage_options=s3_options(proxy.url))
        proxy.body_bytes                            # response body bytes sent since the start (or the last reset())
"""

from __future__ import annotations

import http.client
import multiprocessing as mp
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

CREDENTIALS = {"key": "testing-key", "secret": "testing-secret"}


def s3_options(endpoint: str) -> dict[str, Any]:
    """fsspec storage options for the test server at ``endpoint`` (fake credentials, no region lookup)."""
    return {**CREDENTIALS, "endpoint_url": endpoint, "client_kwargs": {"region_name": "us-east-1"}}


class S3Server:
    """moto's threaded S3 server on a free port of 127.0.0.1 (a context manager)."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)

    def __enter__(self) -> Self:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", CREDENTIALS["key"])
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", CREDENTIALS["secret"])
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id=CREDENTIALS["key"], aws_secret_access_key=CREDENTIALS["secret"])

    def upload_dir(self, local: Path, bucket: str, prefix: str) -> list[str]:
        """Create ``bucket`` (if needed) and upload every file under ``local`` to ``prefix/``; returns the keys."""
        client = self.client()
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        keys = []
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            key = f"{prefix}/{path.relative_to(local).as_posix()}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
            keys.append(key)
        return keys


@dataclass
class _Rule:
    match: str
    fault: str
    times: int
    hits: int = 0


@dataclass
class FaultProxy:
    """A stdlib HTTP proxy to ``upstream`` that injects faults into matching GETs (see the module docstring).

    Faults: ``"500"`` (an S3 InternalError), ``"reset"`` (the connection is
    reset before any response), ``"stall"`` (headers and half the body, then
    ``stall_s`` of silence), ``"truncate"`` (the full Content-Length announced,
    half the body sent, then closed), ``"flip"`` (one body byte XOR 0xFF).
    ``gets`` counts the GETs per path that reached the proxy; ``body_bytes``
    and ``requests`` count the response bodies sent (all but HEAD's, a
    fault's part of a body included) since the start or the last :meth:`reset`.
    ``upstream_timeout`` bounds each forwarded request.
    """

    upstream: str
    stall_s: float = 5.0
    upstream_timeout: float = 30.0
    rules: list[_Rule] = field(default_factory=list)
    gets: dict[str, int] = field(default_factory=dict)
    body_bytes: int = 0
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def add(self, match: str, fault: str, *, times: int = 1) -> None:
        assert fault in ("500", "reset", "stall", "truncate", "flip"), fault
        self.rules.append(_Rule(match, fault, times))

    def hits(self, fault: str) -> int:
        return sum(r.hits for r in self.rules if r.fault == fault)

    def reset(self) -> None:
        """Start counting ``body_bytes`` and ``requests`` again from zero (the rules and ``gets`` are kept)."""
        with self._lock:
            self.body_bytes = self.requests = 0

    def _sent(self, body: bytes) -> None:
        with self._lock:
            self.body_bytes += len(body)
            self.requests += 1

    def _take(self, path: str) -> str | None:
        with self._lock:
            for rule in self.rules:
                if rule.match in path and (rule.times < 0 or rule.hits < rule.times):
                    rule.hits += 1
                    return rule.fault
        return None

    def __enter__(self) -> Self:
        host, port = self.upstream.removeprefix("http://").split(":")
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                fault = None
                if self.command == "GET":
                    with proxy._lock:
                        proxy.gets[self.path] = proxy.gets.get(self.path, 0) + 1
                    fault = proxy._take(self.path)
                if fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if fault == "500":
                    err = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code>"
                           b"<Message>injected</Message></Error>")
                    self.send_response(500)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(err)))
                    self.end_headers()
                    self.wfile.write(err)
                    return
                conn = http.client.HTTPConnection(host, int(port), timeout=proxy.upstream_timeout)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding", "content-length", "server", "date"):
                        self.send_header(k, v)
                head = self.command == "HEAD"
                self.send_header("Content-Length", resp.getheader("Content-Length", "0") if head else str(len(data)))
                self.end_headers()
                if head:
                    return
                if fault == "flip" and data:
                    data = data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]
                if fault in ("stall", "truncate"):
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    proxy._sent(data[: len(data) // 2])
                    if fault == "stall":
                        time.sleep(proxy.stall_s)
                    self.close_connection = True
                    return
                self.wfile.write(data)
                proxy._sent(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def run_spawned(target: Callable[..., None], args_list: Sequence[tuple[Any, ...]], *, timeout: float) -> list[Any]:
    """One spawned process per ``args`` (each gets a result queue as its last argument): the results, in arrival order.

    Every result must arrive within ``timeout`` seconds and every process exit 0 (each join is bounded too).
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, out)) for args in args_list]
    for p in procs:
        p.start()
    results = [out.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return results
