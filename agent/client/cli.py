"""`agent store`: the state store from the command line, against any broker.

Connection settings come from the same environment variables as the agent
(`AGENT_MQTT__HOST`, `AGENT_MQTT__PORT`, `AGENT_MQTT__TLS__CA_FILE`, ...), overridden by
flags, over an env file (--env-file; on a gateway the line's /etc/agent/<line>.env when it
exists); secrets come from files (--password-file, --key-password-file) or the environment.
Exit codes: 0 done, 1 not applied or absent, 2 usage or settings, 3 service error,
4 connection failure or timeout.
How values and keys are printed: see VALUES_SHOWN (`agent store get --help`).
"""

from __future__ import annotations

import argparse
import asyncio
import binascii
import os
import signal
import ssl
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError

from agent import logs
from agent.client.errors import RequestTimeout, StateStoreError
from agent.client.line_env import broker_source, line_env_file, readable
from agent.client.lock import LeasedLock, LossReason, renewal_period_s
from agent.client.session import Session, SessionError, SettingNames
from agent.client.session_errors import (
    ConnectFailed,
    ConnectionRefused,
    TlsHangUp,
    TlsPortWithoutTls,
)
from agent.client.shown import show_value
from agent.client.statestore import Condition, KeyChange, StateStoreClient
from agent.config import (
    ConnectionSettings,
    MqttSettings,
    env_file_problem,
    setting_errors,
    variable_name,
)
from agent.protocol.hlc import Hlc, HlcError

EXIT_OK, EXIT_NOT_APPLIED, EXIT_USAGE, EXIT_SERVICE, EXIT_CONNECTION = 0, 1, 2, 3, 4


VALUES_SHOWN = r"""A value (or key) is printed as it is when it is UTF-8 text of printable
characters. Any other is printed escaped, the same way by every command: a backslash
doubled, a tab, line feed or carriage return as \t, \n, \r, any other byte that is not part
of a printable character as \xHH, any other character that is not printable as \uHHHH (or
\UHHHHHHHH). --hex prints the bytes as hex; get --raw writes them as they are, without a
line feed."""


class UsageError(Exception):
    pass


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "store",
        help="get, set, delete, watch and lock keys in the state store",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    connection_options(parser)
    # The same options after the subcommand; without defaults of their own, so that they do
    # not reset what was given before it.
    shared = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    connection_options(shared, defaults=False)
    commands = parser.add_subparsers(dest="store_command", metavar="COMMAND", required=True)

    get = commands.add_parser(
        "get",
        parents=[shared],
        help="print a key's value (exit 1 when absent)",
        description="Print a key's value (exit 1 when absent). " + VALUES_SHOWN,
    )
    get.add_argument("key")
    shown_as = get.add_mutually_exclusive_group()
    shown_as.add_argument("--hex", action="store_true", help="print the value as hex")
    shown_as.add_argument(
        "--raw",
        action="store_true",
        help="write the value's bytes as they are, without a line feed (for a file or a pipe)",
    )
    get.add_argument("--show-version", action="store_true", help="print the version too")
    get.set_defaults(store_func=_get)

    set_ = commands.add_parser("set", parents=[shared], help="set a key; prints the new version")
    set_.add_argument("key")
    set_.add_argument("value", nargs="?", help="the value; omitted or '-': read stdin")
    cond = set_.add_mutually_exclusive_group()
    cond.add_argument("--nx", action="store_true", help="only if the key does not exist")
    cond.add_argument("--nex", action="store_true", help="only if absent or equal to this value")
    set_.add_argument("--px", type=int, metavar="MS", help="expire after MS milliseconds")
    fence = set_.add_mutually_exclusive_group()
    fence.add_argument("--fencing-token", metavar="HLC", help="fencing token (__ft)")
    fence.add_argument(
        "--fence-with",
        metavar="LOCKKEY",
        help="use the current version of this lock as fencing token: how a remote writer "
        "changes a key that the lock's holder fences (exit 1 when nobody holds the lock)",
    )
    set_.add_argument("--hex", action="store_true", help="the value is given as hex")
    set_.set_defaults(store_func=_set)

    delete = commands.add_parser("del", parents=[shared], help="delete a key (exit 1 when absent)")
    delete.add_argument("key")
    delete.add_argument("--fencing-token", metavar="HLC", help="fencing token (__ft)")
    delete.set_defaults(store_func=_del)

    vdel = commands.add_parser("vdel", parents=[shared], help="delete a key if it holds VALUE")
    vdel.add_argument("key")
    vdel.add_argument("value")
    vdel.add_argument("--fencing-token", metavar="HLC", help="fencing token (__ft)")
    vdel.add_argument("--hex", action="store_true", help="the value is given as hex")
    vdel.set_defaults(store_func=_vdel)

    watch = commands.add_parser(
        "watch",
        parents=[shared],
        help="print every change of the keys until Ctrl-C",
        description="Print every change of the keys until Ctrl-C. " + VALUES_SHOWN,
    )
    watch.add_argument("keys", nargs="+", metavar="key")
    watch.add_argument("--hex", action="store_true", help="print values as hex")
    watch.set_defaults(store_func=_watch)

    lock = commands.add_parser(
        "lock", parents=[shared], help="acquire a lock, hold it, release it on Ctrl-C"
    )
    lock.add_argument("key")
    lock.add_argument("--holder", help="the holder's name (default: the client id)")
    lock.add_argument("--ttl-ms", type=int, default=3000, help="lease length (3000)")
    lock.add_argument(
        "--no-wait", action="store_true", help="exit 1 at once when someone else holds it"
    )
    lock.set_defaults(store_func=_lock)

    parser.set_defaults(func=run)


# Flag -> where it goes in the settings. Values given as flags win over the environment.
_SETTING_FLAGS: dict[str, tuple[str, ...]] = {
    "host": ("host",),
    "port": ("port",),
    "client_id": ("client_id",),
    "username": ("username",),
    "sat_file": ("sat_file",),
    "tls": ("tls", "enabled"),
    "ca_file": ("tls", "ca_file"),
    "cert_file": ("tls", "cert_file"),
    "key_file": ("tls", "key_file"),
}
# Secrets come from files, never from flags, so that they stay out of process listings.
_SECRET_FILE_FLAGS: dict[str, tuple[str, ...]] = {
    "password_file": ("password",),
    "key_password_file": ("tls", "key_password"),
}
# The secret flags a user may try (argparse would take them for the file flags they begin,
# and say the secret in its error as a file name): refused, never echoing the value.
_SECRET_FLAGS = {"password": "password_file", "key_password": "key_password_file"}


def connection_options(parser: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    conn = parser.add_argument_group("connection (default: AGENT_MQTT__* environment)")
    conn.add_argument(
        "--env-file",
        type=Path,
        help="read the settings the environment does not give from this env file, as the "
        "agent does (default on a gateway: the line's /etc/agent/<line>.env, or the only "
        "line's there; /dev/null for none)",
    )
    conn.add_argument("--host", help="broker host (AGENT_MQTT__HOST)")
    conn.add_argument("--port", type=int, help="broker port (AGENT_MQTT__PORT)")
    conn.add_argument("--client-id", help="MQTT client id (default: a random one)")
    conn.add_argument("--username", help="user name (AGENT_MQTT__USERNAME)")
    conn.add_argument(
        "--password-file",
        type=Path,
        help="file holding the password (or AGENT_MQTT__PASSWORD); never a flag, so that "
        "it stays out of process listings",
    )
    for secret in _SECRET_FLAGS:  # no connection flags: refused, and not in the help
        parser.add_argument(_flag(secret), dest=f"secret_flag_{secret}", help=argparse.SUPPRESS)
    conn.add_argument(
        "--sat-file",
        type=Path,
        help="Kubernetes service account token file: K8S-SAT authentication (AGENT_MQTT__SAT_FILE)",
    )
    conn.add_argument(
        "--tls",
        action="store_true",
        default=default(None),
        help="use TLS, trusting the system's CAs (AGENT_MQTT__TLS__ENABLED); implied by the "
        "file flags below",
    )
    conn.add_argument(
        "--ca-file", type=Path, help="CA bundle of the broker (AGENT_MQTT__TLS__CA_FILE)"
    )
    conn.add_argument(
        "--cert-file", type=Path, help="client certificate, PEM (AGENT_MQTT__TLS__CERT_FILE)"
    )
    conn.add_argument("--key-file", type=Path, help="client key, PEM (AGENT_MQTT__TLS__KEY_FILE)")
    conn.add_argument(
        "--key-password-file",
        type=Path,
        help="file holding the password of an encrypted --key-file "
        "(or AGENT_MQTT__TLS__KEY_PASSWORD)",
    )
    conn.add_argument(
        "--timeout", type=float, default=default(10.0), help="seconds to wait for the broker (10)"
    )
    conn.add_argument("--log-level", default=default("ERROR"), help="log level (ERROR)")


def run(args: argparse.Namespace) -> int:
    logs.setup(args.log_level)
    try:
        settings = connection_settings(args)
    except UsageError as exc:
        print(f"agent store: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(_main(args, settings))
    except UsageError as exc:
        print(f"agent store: {exc}", file=sys.stderr)
        return EXIT_USAGE


def env_file_of(args: argparse.Namespace) -> Path | None:
    """The env file the command reads (see line_env_file): --env-file, which must be one
    (else UsageError), or the line's that the command's line or device names."""
    given = getattr(args, "env_file", None)
    if given is not None:
        problem = env_file_problem(given)
        if problem is not None:
            raise UsageError(f"--env-file {given}: {problem}")
    named = (getattr(args, dest, None) for dest in ("target", "line", "device"))
    return line_env_file(given, next((n for n in named if isinstance(n, str)), None))


def connection_settings(args: argparse.Namespace) -> MqttSettings:
    """The environment's settings (as the agent reads them), with the flags on top, over
    the env file's."""
    for secret, file_dest in _SECRET_FLAGS.items():
        if getattr(args, f"secret_flag_{secret}", None) is not None:
            variable = variable_name(".".join(("mqtt", *_SECRET_FILE_FLAGS[file_dest])))
            raise UsageError(
                f"{_flag(secret)}: a secret is never a flag (process listings show flags): "
                f"put it in a file for {_flag(file_dest)}, or in {variable}"
            )
    flags: dict[str, Any] = {}
    given: dict[tuple[str, ...], str] = {}  # settings path -> the flag that set it
    for name, path in _SETTING_FLAGS.items():
        value = getattr(args, name, None)
        if value is not None:
            _put(flags, path, value)
            given[path] = "--" + name.replace("_", "-")
    for name, path in _SECRET_FILE_FLAGS.items():
        file = getattr(args, name, None)
        if file is None:
            continue
        flag = "--" + name.replace("_", "-")
        try:
            secret = file.read_text().rstrip("\n")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not text"
            raise UsageError(f"cannot read {flag} {file}: {reason}") from None
        _put(flags, path, SecretStr(secret))
        given[path] = flag
    try:
        return ConnectionSettings(  # type: ignore[call-arg]
            _env_file=readable(env_file_of(args)), _env_file_encoding="utf-8", mqtt=flags
        ).mqtt
    except ValidationError as exc:
        raise UsageError("invalid settings: " + "; ".join(_errors(exc, given))) from None


def setting_names(args: argparse.Namespace) -> SettingNames:
    """How the user of a command calls each connection setting, in the session's messages:
    the flag they typed, else the environment variable when it is set, else the flag to
    type (--timeout for the connect timeout, which it bounds)."""
    dests = {".".join(("mqtt", *path)): dest for dest, path in _SETTING_FLAGS.items()}
    dests |= {".".join(("mqtt", *path)): dest for dest, path in _SECRET_FILE_FLAGS.items()}
    dests["mqtt.connect_timeout_s"] = "timeout"
    environment = {name.upper() for name in os.environ}

    def name(path: str) -> str:
        dest, variable = dests.get(path), variable_name(path)
        if dest is None or (getattr(args, dest, None) is None and variable in environment):
            return variable
        return _flag(dest)

    return name


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _put(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    tree[path[-1]] = value


def _errors(exc: ValidationError, given: dict[tuple[str, ...], str]) -> list[str]:
    """Each error named by its flag when a flag set it, else by its environment variable."""
    lines = []
    for error, line in zip(exc.errors(), setting_errors(exc), strict=True):
        path = tuple(str(part) for part in error["loc"])
        flag = given.get(path[1:]) if path[:1] == ("mqtt",) else None
        if flag is None:
            lines.append(line)
        else:
            lines.append(f"{flag}: {error['msg'].removeprefix('Value error, ')}")
    return lines


def _value(args: argparse.Namespace) -> bytes:
    raw: bytes
    if getattr(args, "value", None) in (None, "-"):
        raw = sys.stdin.buffer.read()
    else:
        raw = args.value.encode()
    if args.hex:
        try:
            return binascii.unhexlify(raw.strip())
        except binascii.Error as exc:
            raise UsageError(f"not hex: {exc}") from None
    return raw


def _token(args: argparse.Namespace) -> Hlc | None:
    if args.fencing_token is None:
        return None
    try:
        return Hlc.parse(args.fencing_token)
    except HlcError as exc:
        raise UsageError(f"--fencing-token: {exc}") from None


def _show(value: bytes, as_hex: bool) -> str:
    return value.hex() if as_hex else show_value(value)


async def _main(args: argparse.Namespace, settings: MqttSettings) -> int:
    command: Callable[[StateStoreClient, argparse.Namespace], Awaitable[int]] = args.store_func
    return await with_client(args, settings, "agent store", lambda c: command(c, args))


def run_one_shot(
    args: argparse.Namespace,
    name: str,
    work: Callable[[StateStoreClient], Awaitable[int]],
    check: Callable[[], None] = lambda: None,
) -> int:
    """What a one-shot command against the store does: logging, the connection settings and
    the command's own `check` of its arguments (a UsageError is exit 2, said with `name`),
    then `work` with a connected client (see with_client)."""
    logs.setup(args.log_level)
    try:
        settings = connection_settings(args)
        check()
    except UsageError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(with_client(args, settings, name, work))


async def with_client(
    args: argparse.Namespace,
    settings: MqttSettings,
    name: str,
    work: Callable[[StateStoreClient], Awaitable[int]],
) -> int:
    """Connects (failing fast where a person waits), runs `work`, maps failures to the exit
    codes above."""
    client_id = settings.client_id or f"agent-store-{uuid.uuid4().hex[:12]}"
    if settings.connect_timeout_s >= args.timeout:
        # One attempt ends before the wait does, so that what went wrong can be said (a TLS
        # handshake with a port without TLS, say), not only that the time is up.
        settings = settings.model_copy(update={"connect_timeout_s": args.timeout / 2})
    try:
        session = Session(settings, client_id=client_id, names=setting_names(args))
    except SessionError as exc:  # TLS files that cannot be used
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        await session.start(wait=True, timeout=args.timeout, fail_fast=True)
    except (SessionError, OSError) as exc:
        said = f"{name}: cannot connect to {settings.host}:{settings.port}: {exc}"
        if not _answered(exc):  # else the address was right, and the error says what is not
            flags = {"host": args.host is not None, "port": args.port is not None}
            said += ". " + broker_source(flags, env_file_of(args))
        print(said, file=sys.stderr)
        return EXIT_CONNECTION
    try:
        async with StateStoreClient(session, request_timeout_s=args.timeout) as client:
            return await work(client)
    except (RequestTimeout, SessionError, OSError) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_CONNECTION
    except StateStoreError as exc:  # the service's -ERR text, or an answer we cannot use
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_SERVICE
    finally:
        await session.stop()


def _answered(exc: BaseException) -> bool:
    """Whether a failed connect reached a broker (it refused the client, or TLS failed)."""
    if isinstance(exc, ConnectFailed) and exc.failure is not None:
        return isinstance(exc.failure, ssl.SSLError) or _answered(exc.failure)
    return isinstance(exc, (ConnectionRefused, TlsHangUp, TlsPortWithoutTls))


async def _get(client: StateStoreClient, args: argparse.Namespace) -> int:
    if args.raw and args.show_version:
        raise UsageError("--raw writes the value alone: leave out --show-version")
    value, version = await client.get(args.key)
    if value is None:
        return EXIT_NOT_APPLIED
    if args.raw:
        sys.stdout.buffer.write(value)
        sys.stdout.flush()
        return EXIT_OK
    print(_show(value, args.hex) + (f"\t{version}" if args.show_version else ""))
    return EXIT_OK


async def _set(client: StateStoreClient, args: argparse.Namespace) -> int:
    if args.px is not None and args.px <= 0:
        raise UsageError("--px must be a positive number of milliseconds")
    condition = Condition.NX if args.nx else Condition.NEX if args.nex else None
    token = _token(args)
    if args.fence_with is not None:
        holder, token = await client.get(args.fence_with)
        if holder is None:
            print(f"nobody holds {args.fence_with}: nothing to fence with", file=sys.stderr)
            return EXIT_NOT_APPLIED
    result = await client.set(
        args.key, _value(args), condition=condition, expiry_ms=args.px, fencing_token=token
    )
    if not result.applied:
        print(f"not applied (current version {result.version})", file=sys.stderr)
        return EXIT_NOT_APPLIED
    print(result.version)
    return EXIT_OK


async def _del(client: StateStoreClient, args: argparse.Namespace) -> int:
    count = await client.delete(args.key, fencing_token=_token(args))
    return EXIT_OK if count == 1 else EXIT_NOT_APPLIED


async def _vdel(client: StateStoreClient, args: argparse.Namespace) -> int:
    result = await client.vdelete(args.key, _value(args), fencing_token=_token(args))
    if result == -1:
        print("not deleted: the key holds another value", file=sys.stderr)
    return EXIT_OK if result == 1 else EXIT_NOT_APPLIED


async def _first_of(timeout: float, *waits: Awaitable[object]) -> None:
    """Returns when the first of `waits` is done or `timeout` passes; cancels the rest."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _watch(client: StateStoreClient, args: argparse.Namespace) -> int:
    stop = _stop_event()

    def show(change: KeyChange) -> None:
        key = show_value(change.key)
        value = "" if change.value is None else " " + _show(change.value, args.hex)
        print(f"{change.version or '-'} {change.kind} {key}{value}", flush=True)

    for key in args.keys:
        await client.observe(key, show)
    print(f"watching {' '.join(args.keys)}", file=sys.stderr, flush=True)
    await stop.wait()
    return EXIT_OK


async def _lock(client: StateStoreClient, args: argparse.Namespace) -> int:
    if args.ttl_ms <= 0:
        raise UsageError("--ttl-ms must be positive")
    stop = _stop_event()
    lost: asyncio.Future[LossReason] = asyncio.get_running_loop().create_future()
    released = asyncio.Event()
    lock = LeasedLock(client, args.key, args.holder or client.client_id)
    lock.on_lost(lambda reason: lost.done() or lost.set_result(reason))
    await lock.observe(lambda change: released.set() if change.kind == "DELETE" else None)

    token = await lock.try_acquire(args.ttl_ms)
    while token is None:
        if args.no_wait:
            holder = await lock.current_holder()
            print(f"held by {_show(holder or b'?', False)}", file=sys.stderr)
            return EXIT_NOT_APPLIED
        released.clear()
        # Wait for a release or expiry, polling as a safety net for a missed notification.
        await _first_of(args.ttl_ms / 1000, released.wait(), stop.wait())
        if stop.is_set():
            return EXIT_NOT_APPLIED
        token = await lock.try_acquire(args.ttl_ms)
    print(f"acquired {token}", flush=True)

    period = renewal_period_s(args.ttl_ms)
    while not stop.is_set() and not lost.done():
        await _first_of(period, stop.wait(), asyncio.shield(lost))
        if stop.is_set() or lost.done():
            break
        try:
            await lock.renew(timeout=period)
        except (RequestTimeout, SessionError) as exc:
            print(f"renewal failed: {exc}", file=sys.stderr, flush=True)
    if lost.done():
        print(f"lost: {lost.result().value}", file=sys.stderr, flush=True)
        return EXIT_NOT_APPLIED
    await lock.release()
    print("released", flush=True)
    return EXIT_OK
