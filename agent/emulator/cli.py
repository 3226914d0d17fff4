"""`agent emulator`: a local state store for developers and tests."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from agent import logs
from agent.emulator.limits import BrokerLimits, StoreLimits
from agent.emulator.persistence import FsyncPolicy

EXIT_USAGE = 2
EXIT_CONFIG = 78  # EX_CONFIG: a file or value that makes no sense
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: the port to listen on, or the broker to serve on

_EPILOG = """\
file formats:
  --authz FILE      authorization rules, JSON in the shape of the real broker's
                    BrokerAuthorization: {"rules": [{"principals": {"clientIds": [...],
                    "usernames": [...], "certificateSubjects": [...]},
                    "brokerResources": [{"method": "Connect"}, {"method": "Publish",
                    "topics": [...]}, {"method": "Subscribe", "topics": [...]}],
                    "stateStoreResources": [{"keyType": "Pattern|String|Binary",
                    "keys": [...], "method": "Read|Write|ReadWrite"}]}]}.
                    Allow-only; {principal.clientId} and {principal.username} in topics
                    and keys; see the README.
  --users FILE      JSON {"user": "password", ...}; CONNECT user names are checked.
  --sat-tokens PATH accepted K8S-SAT tokens: a file (one a line) or a directory (one a
                    file), read again when it changes.
  With --users or --sat-tokens, a client must authenticate (a verified client
  certificate also does): bad password 0x86, bad token 0x87, other method 0x8C.
"""


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "emulator",
        help="run a local state store (embedded MQTT 5 broker, or on an external broker)",
        description="Runs an MQTT 5 broker that hosts a local state store. Prints one line "
        "with mqtt://HOST:PORT (mqtts:// with TLS) once it accepts connections, then serves "
        "until SIGINT or SIGTERM.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = BrokerLimits.default()
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=1883, help="port to listen on (0: any)")
    parser.add_argument("--quota", type=int, default=None, help="maximum number of keys")
    parser.add_argument(
        "--deny-prefix",
        action="append",
        default=[],
        metavar="PREFIX",
        help="refuse access to keys starting with PREFIX ('not authorized'); repeatable",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="keep the store's contents in DIR across restarts (default: in memory only)",
    )
    parser.add_argument(
        "--fsync",
        choices=[policy.value for policy in FsyncPolicy],
        default=FsyncPolicy.ALWAYS.value,
        help="with --data-dir, when a change is answered: always (default) once its record "
        "is fsynced, so a power cut loses nothing acknowledged; everysec once it is written "
        "to the file, fsynced every second (a power cut may lose the last second or so); no "
        "once written, fsynced when the system flushes (a power cut may lose ~30 s). A "
        "crash of the emulator loses nothing acknowledged in any of them",
    )
    parser.add_argument(
        "--external",
        metavar="URL",
        help="instead of embedding a broker, serve as a client of the broker at URL "
        "(mqtt://HOST:PORT); see the README for what this mode can see",
    )
    security = parser.add_argument_group("security (embedded broker)")
    security.add_argument("--authz", type=Path, metavar="FILE", help="authorization rules (JSON)")
    security.add_argument("--users", type=Path, metavar="FILE", help="user names and passwords")
    security.add_argument("--sat-tokens", type=Path, metavar="PATH", help="K8S-SAT tokens")
    security.add_argument("--tls-cert", type=Path, metavar="PEM", help="serve TLS with this")
    security.add_argument("--tls-key", type=Path, metavar="PEM", help="the key of --tls-cert")
    security.add_argument(
        "--client-ca",
        type=Path,
        metavar="PEM",
        help="require client certificates signed by this CA (mutual TLS)",
    )
    _limit_flags(
        parser.add_argument_group("limits (embedded broker)"),
        defaults,
        [
            ("--max-packet-size", "max_packet_size", int, "BYTES",
             "largest packet a client may send, advertised in CONNACK"),
            ("--max-queued-bytes", "max_queued_bytes", int, "BYTES",
             "what may wait to be sent to one client; past it its QoS 0 messages are dropped "
             "and a QoS 1 message disconnects it"),
            ("--max-connections", "max_connections", int, "N", "open connections at once"),
            ("--max-connection-rate", "max_connection_rate", float, "PER_S",
             "new connections per second"),
            ("--connect-timeout", "connect_timeout_s", float, "S",
             "a client that has not completed CONNECT by then is closed"),
            ("--max-connect-size", "max_connect_size", int, "BYTES",
             "largest CONNECT: what a client not yet authenticated may send"),
        ],
    )  # fmt: skip
    _limit_flags(
        parser.add_argument_group("limits of the store"),
        StoreLimits(),
        [
            ("--max-key-size", "max_key_size", int, "BYTES",
             "longest key a SET or KEYNOTIFY may name"),
            ("--max-registrations", "max_registrations", int, "N",
             "KEYNOTIFY registrations one client may hold"),
            ("--max-registration-bytes", "max_registration_bytes", int, "BYTES",
             "bytes of the key names one client's registrations may hold together"),
        ],
    )  # fmt: skip
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING, ERROR")
    parser.set_defaults(func=run)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    repair = actions.add_parser(
        "repair",
        help="repair a damaged --data-dir log",
        description="Writes a repaired DIR/store.log from every whole record before and "
        "after the damage, keeps the damaged file beside it (store.log.damaged) and says "
        "what it dropped. Run it while no emulator uses DIR. Exit 0 when repaired or "
        "whole, 78 when it cannot be done.",
    )
    repair.add_argument("--data-dir", type=Path, metavar="DIR", required=True)
    repair.set_defaults(func=run_repair)


def run_repair(args: argparse.Namespace) -> int:
    from agent.emulator.persistence import PersistenceError
    from agent.emulator.repair import repair

    try:
        repaired = repair(args.data_dir)
    except PersistenceError as error:
        print(f"agent emulator repair: {error}", file=sys.stderr)
        return EXIT_CONFIG
    print(repaired.describe())
    return 0


def _limit_flags(group: Any, limits: object, flags: list[tuple[str, str, type, str, str]]) -> None:
    """One flag per limit: (flag, the limit's field, its type, metavar, what it bounds)."""
    for flag, field, kind, metavar, what in flags:
        group.add_argument(
            flag,
            type=kind,
            default=getattr(limits, field),
            metavar=metavar,
            help=f"{what} (default %(default)s)",
        )


class _ConfigError(Exception):
    pass


def _start_error(args: argparse.Namespace, error: BaseException | None) -> tuple[str, int] | None:
    """What to say, in one line, and the exit code, when the service could not start."""
    from agent.client.session_errors import ConnectFailed, SessionError, TlsPortWithoutTls
    from agent.emulator.persistence import PersistenceError

    if error is None:
        return None
    if isinstance(error, PersistenceError):
        return f"--data-dir: {error}", EXIT_CONFIG
    if isinstance(error, ConnectFailed) and isinstance(error.failure, TlsPortWithoutTls):
        # The session would say to turn TLS on, which --external does not speak.
        return (
            f"cannot use the broker at {args.external}: that port speaks TLS, and --external "
            "connects without it: give it the broker's plain MQTT port",
            EXIT_UNAVAILABLE,
        )
    if isinstance(error, SessionError):
        return f"cannot reach the broker at {args.external}: {error}", EXIT_UNAVAILABLE
    if isinstance(error, OSError) and not args.external:
        why = os.strerror(error.errno) if error.errno else str(error)
        return f"cannot listen on {args.host}:{args.port}: {why}", EXIT_UNAVAILABLE
    raise error


def run(args: argparse.Namespace) -> int:
    logs.setup(args.log_level)
    if args.quota is not None and args.quota < 1:
        print("agent emulator: --quota must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    try:
        options = _options(args)
    except _ConfigError as error:
        print(f"agent emulator: {error}", file=sys.stderr)
        return EXIT_CONFIG
    return asyncio.run(_serve(args, options))


def _authorizer(prefixes: list[str]) -> Any:
    if not prefixes:
        return None
    denied = tuple(p.encode() for p in prefixes)
    return lambda client_id, key, access: not key.startswith(denied)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The service's options from the flags; _ConfigError names the flag that is wrong."""
    from agent.emulator.authn import Authenticator, CredentialsError, TokenFile, load_users
    from agent.emulator.authz import RulesError, parse_rules
    from agent.emulator.tls import TlsConfigError, server_context

    try:
        store_limits = StoreLimits(
            max_key_size=args.max_key_size,
            max_registrations=args.max_registrations,
            max_registration_bytes=args.max_registration_bytes,
        )
    except ValueError as error:
        raise _ConfigError(f"--{str(error).replace('_', '-')}") from None
    options: dict[str, Any] = {
        "quota": args.quota,
        "authorizer": _authorizer(args.deny_prefix),
        "store_limits": store_limits,
    }
    embedded_only = ("authz", "users", "sat_tokens", "tls_cert", "tls_key", "client_ca")
    if args.external:
        used = [f"--{name.replace('_', '-')}" for name in embedded_only if getattr(args, name)]
        if used or args.data_dir:
            flags = ", ".join(used + (["--data-dir"] if args.data_dir else []))
            raise _ConfigError(f"{flags}: only with the embedded broker, not with --external")
        return options
    try:
        options["limits"] = BrokerLimits(
            max_packet_size=args.max_packet_size,
            max_queued_bytes=args.max_queued_bytes,
            max_connections=args.max_connections,
            max_connection_rate=args.max_connection_rate,
            connect_timeout_s=args.connect_timeout,
            max_connect_size=args.max_connect_size,
        )
    except ValueError as error:
        raise _ConfigError(f"--{str(error).replace('_', '-')}") from None
    if args.authz is not None:
        try:
            options["rules"] = parse_rules(args.authz.read_text())
        except OSError as error:
            raise _ConfigError(f"--authz {args.authz}: {error.strerror or error}") from None
        except RulesError as error:
            raise _ConfigError(f"--authz {args.authz}: {error}") from None
    if args.users is not None or args.sat_tokens is not None:
        try:
            users = load_users(args.users) if args.users is not None else None
            tokens = TokenFile(args.sat_tokens) if args.sat_tokens is not None else None
        except CredentialsError as error:
            flag = (
                "--users"
                if args.users is not None and str(args.users) in str(error)
                else ("--sat-tokens")
            )
            raise _ConfigError(f"{flag}: {error}") from None
        options["authenticator"] = Authenticator(users=users, tokens=tokens)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise _ConfigError("--tls-cert and --tls-key go together")
    if args.client_ca is not None and args.tls_cert is None:
        raise _ConfigError("--client-ca needs --tls-cert and --tls-key")
    if args.tls_cert is not None:
        try:
            options["ssl_context"] = server_context(args.tls_cert, args.tls_key, args.client_ca)
        except TlsConfigError as error:
            raise _ConfigError(f"--tls-cert/--tls-key/--client-ca: {error}") from None
    if args.data_dir is not None:
        options["data_dir"] = args.data_dir
        options["fsync"] = FsyncPolicy(args.fsync)
    return options


async def _serve(args: argparse.Namespace, options: dict[str, Any]) -> int:
    stop = asyncio.Event()
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    service: Any
    if args.external:
        from agent.emulator.external import ExternalStateStore

        service = ExternalStateStore(args.external, **options)
    else:
        from agent.emulator.embedded import EmbeddedStateStore

        service = EmbeddedStateStore(args.host, args.port, **options)
    # Ctrl-C is honoured while it starts too (waiting for an external broker, say).
    starting = asyncio.ensure_future(service.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not starting.done():
        starting.cancel()
        await asyncio.wait((starting,))
        await service.stop()
        print("agent emulator: stopped before it was ready", file=sys.stderr)
        return 128 + received[0]
    error = _start_error(args, starting.exception())
    if error is not None:
        message, code = error
        print(f"agent emulator: {message}", file=sys.stderr)
        return code
    print(f"state store ready at {service.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await service.stop()
    return 0
