"""A local HTTP answer for scripts, load balancers and monitoring, in the spirit of
Patroni's REST API: the status code says it, the body (JSON) says more.

- `/`, `/active`, `/leader`, `/primary`, `/read-write`: 200 when this instance is active
  (holds the line's lock, paused or not), else 503;
- `/standby`, `/replica`: 200 when it is standby and not failing, else 503;
- `/health`, `/readiness`: 200 unless it is failing (not connected to the broker, a job of
  the agent stopped, or as active its line down), else 503;
- `/paused`: 200 when the line is paused, else 503;
- `/liveness`: 200 whenever the agent answers;
- `/metrics`: the instance's metrics for Prometheus (agent.runtime.metrics), unless
  `AGENT_HEALTH__METRICS` is false.

GET, HEAD and OPTIONS; anything else is 405, an unknown path 404. On port 9732 unless
`AGENT_HEALTH__PORT` says otherwise (empty: none); it listens on loopback unless
`AGENT_HEALTH__HOST` says otherwise, from the start (before the broker is reached: 503 but
for /liveness until the role is known), and an address it cannot listen on is a setting
error (the default port taken: no endpoint, said). Plain asyncio: a request line and
headers of at most 8 KiB, read within 5 s, at most 16 connections at once (more are closed
at once), one answer each, then closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.config.health import HealthSettings


log = logging.getLogger("agent")

MAX_REQUEST_BYTES = 8192
READ_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 16

Answer = Callable[[], dict[str, Any]]
"""The instance's health document: at least `role` and `state` (running, paused, failing)."""
Exposition = Callable[[], bytes]
"""The instance's metrics in Prometheus's text format (agent.runtime.metrics)."""
METRICS_PATH = "/metrics"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}  # fmt: skip
_ACTIVE = frozenset({"/", "/active", "/leader", "/primary", "/read-write"})
_STANDBY = frozenset({"/standby", "/replica"})
_HEALTH = frozenset({"/health", "/readiness"})


def status_for(path: str, document: dict[str, Any]) -> int:
    """The status code of `path` for an instance described by `document` (pure)."""
    role, state = document.get("role"), document.get("state")
    if path in _ACTIVE:
        ok = role == "active"
    elif path in _STANDBY:
        ok = role == "standby" and state != "failing"
    elif path in _HEALTH:
        ok = role in ("active", "standby") and state != "failing"
    elif path == "/paused":
        ok = bool(document.get("paused"))
    elif path == "/liveness":
        ok = True
    else:
        return 404
    return 200 if ok else 503


def unusable_setting(error: OSError) -> str:
    """Which setting a failure to listen is about: `port` when the port is taken (or
    privileged), else `host` (not an address of this machine, or a name that does not
    resolve)."""
    return "port" if error.errno in (errno.EADDRINUSE, errno.EACCES) else "host"


class UnusableSetting(Exception):
    """The endpoint cannot listen where its settings say (the message names the setting)."""


async def open_endpoint(
    settings: HealthSettings, answer: Answer, metrics: Exposition | None
) -> HealthEndpoint | None:
    """The endpoint listening (its address logged); None when its port is set empty, or the
    default port is taken (said)."""
    if settings.port is None:
        return None
    endpoint = HealthEndpoint(settings.host, settings.port, answer, metrics)
    try:
        host, port = await endpoint.start()
    except OSError as exc:
        name = unusable_setting(exc)
        if name == "port" and "port" not in settings.model_fields_set:
            # The default, not asked for: a second instance on this host (a pair tried on
            # one machine) runs without an endpoint rather than not at all.
            log.warning(
                "the health endpoint's default port %s:%d is taken (another instance on this "
                "host?): no health endpoint and no metrics; set AGENT_HEALTH__PORT to another "
                "port, or empty for none",
                settings.host,
                settings.port,
            )
            return None
        raise UnusableSetting(
            f"invalid setting AGENT_HEALTH__{name.upper()} (health.{name}): the health "
            f"endpoint cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}"
        ) from None
    shown = f", metrics at http://{host}:{port}{METRICS_PATH}" if metrics is not None else ""
    log.info("health endpoint at http://%s:%d/health%s", host, port, shown)
    return endpoint


class HealthEndpoint:
    def __init__(
        self, host: str, port: int, answer: Answer, metrics: Exposition | None = None
    ) -> None:
        self.host = host
        self.port = port
        self._answer = answer
        self._metrics = metrics
        self._server: asyncio.Server | None = None
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._connections: set[asyncio.Task[Any]] = set()

    async def start(self) -> tuple[str, int]:
        """Listens; returns the address (the port chosen, for port 0)."""
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, limit=MAX_REQUEST_BYTES
        )
        host, port = self._server.sockets[0].getsockname()[:2]
        self.port = port
        return host, port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._slots.locked():
            writer.close()  # too many at once: close, never queue
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            async with self._slots:
                await self._answer_one(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _answer_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except (TimeoutError, asyncio.IncompleteReadError):
            return
        except asyncio.LimitOverrunError:
            await self._send(writer, 400, {"error": "request too large"}, head=False)
            return
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            await self._send(writer, 400, {"error": "not an HTTP request"}, head=False)
            return
        method, target = parts[0], parts[1]
        path = target.split("?", 1)[0].rstrip("/") or "/"
        if method not in ("GET", "HEAD", "OPTIONS"):
            await self._send(writer, 405, {"error": f"{method} not allowed"}, head=False)
            return
        if path == METRICS_PATH and self._metrics is not None:
            await self._send_metrics(writer, head=method == "HEAD")
            return
        try:
            document = self._answer()
        except Exception:  # a bug must not take the endpoint down: say failing
            log.exception("health endpoint: no answer")
            document = {"role": "unknown", "state": "failing"}
        code = status_for(path, document)
        body = document if code != 404 else {"error": f"no such path: {path}"}
        await self._send(writer, code, body, head=method == "HEAD")

    async def _send_metrics(self, writer: asyncio.StreamWriter, *, head: bool) -> None:
        assert self._metrics is not None
        try:
            payload = self._metrics()
        except Exception:  # a bug must not take the endpoint down: say so
            log.exception("health endpoint: no metrics")
            await self._send(writer, 503, {"error": "no metrics"}, head=head)
            return
        await self._send_bytes(writer, 200, payload, METRICS_CONTENT_TYPE, head=head)

    async def _send(
        self, writer: asyncio.StreamWriter, code: int, body: dict[str, Any], *, head: bool
    ) -> None:
        payload = json.dumps(body, separators=(",", ":")).encode() + b"\n"
        await self._send_bytes(writer, code, payload, "application/json", head=head)

    async def _send_bytes(
        self,
        writer: asyncio.StreamWriter,
        code: int,
        payload: bytes,
        content_type: str,
        *,
        head: bool,
    ) -> None:
        headers = [
            f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(payload)}",
            "Cache-Control: no-cache",
            "Connection: close",
        ]
        if code == 405:
            headers.append("Allow: GET, HEAD, OPTIONS")
        writer.write(("\r\n".join(headers) + "\r\n\r\n").encode() + (b"" if head else payload))
        async with asyncio.timeout(READ_TIMEOUT_S):
            await writer.drain()
