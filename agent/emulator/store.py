"""The state store's state machine (protocol.md §2-§8), pure: no I/O, time injected.

`StateStore.handle()` takes one request as the service receives it and returns the reply
and the notifications it causes; `expire()` deletes what has expired. The MQTT side
(`service.py`) only moves bytes and properties in and out.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from agent.emulator.authz import Access
from agent.emulator.limits import StoreLimits
from agent.protocol import errors
from agent.protocol.hlc import (
    MAX_CLOCK_DRIFT_MS,
    Hlc,
    HlcError,
    HybridLogicalClock,
    WallClock,
)
from agent.protocol.resp3 import (
    OK,
    ErrorReply,
    Notification,
    Resp3Error,
    Response,
    decode_request,
    encode_notification,
    encode_response,
)

Authorizer = Callable[[str, bytes, Access], bool]
"""(client id, key, access) -> allowed. GET and KEYNOTIFY read; SET, DEL and VDEL write."""

MonotonicClock = Callable[[], int]
"""Milliseconds on a clock that never steps; key expiry is measured on it."""


@dataclass(slots=True)
class Entry:
    """One key's state. Replaced on every change, never modified (journals rely on it)."""

    value: bytes
    version: Hlc
    fencing_token: Hlc | None = None
    expires_at_ms: int | None = None


class Journal(Protocol):
    """Where the store reports its changes to be kept (``persistence.StoreJournal``)."""

    def writable(self) -> bool:
        """Whether a SET is kept now; while not, the store refuses SETs (deletes go on)."""
        ...

    def put(self, key: bytes, entry: Entry) -> int:
        """Queues the change to be kept; returns its record's number (increasing)."""
        ...

    def delete(self, key: bytes) -> int: ...

    def observe_clock(self, current: Hlc) -> None:
        """Called after each request and each expiry, once its changes are made."""
        ...


# The answer to a write while the journal cannot keep it (a full disk); clients keep an
# unknown text as a generic service error (protocol.md §2).
DISK_FAILED = "the store cannot write to its disk"
# The local store's own bounds (limits.StoreLimits), each with a text of its own.
KEY_TOO_LONG = "the key is longer than the store accepts"
TOO_MANY_REGISTRATIONS = "this client holds as many registrations as it may"
REGISTRATIONS_TOO_LARGE = "this client's registrations' key names take all the bytes they may"

# The node id a restored clock bound is merged under: never the service's own.
_RESTORED_NODE = "~restored"


@dataclass(slots=True)
class _Watch:
    """The registrations for one key name: the clients, in registration order."""

    name: bytes
    clients: dict[str, None] = field(default_factory=dict)  # an ordered set


@dataclass(frozen=True, slots=True)
class Reply:
    payload: bytes
    timestamp: Hlc | None


@dataclass(frozen=True, slots=True)
class KeyNotification:
    client_id: str
    key: bytes
    payload: bytes
    timestamp: Hlc


@dataclass(frozen=True, slots=True)
class Outcome:
    reply: Reply
    notifications: list[KeyNotification] = field(default_factory=list)


class _Refused(Exception):
    """Ends a request with `-ERR <text>`."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


@dataclass(frozen=True, slots=True)
class _SetOptions:
    condition: bytes | None  # b"NX" or b"NEX"
    expiry_ms: int | None


_NO_OPTIONS = _SetOptions(None, None)


def _parse_set_options(options: list[bytes]) -> _SetOptions:
    if not options:
        return _NO_OPTIONS  # the plain SET; the dataclass is frozen, so one instance will do
    condition: bytes | None = None
    expiry_ms: int | None = None
    seen_px = False
    it: Iterator[bytes] = iter(options)
    for raw in it:
        word = raw.upper()
        if word in (b"NX", b"NEX"):
            if condition is not None:
                raise _Refused(errors.SYNTAX_ERROR)
            condition = word
        elif word == b"PX":
            number = next(it, None)
            # Bounded like every number of the RESP3 decoder: int() of thousands of digits
            # is slow, and past 4300 it raises.
            if (
                seen_px
                or number is None
                or len(number) > _MAX_DIGITS
                or not number.isdigit()
                or int(number) <= 0
            ):
                raise _Refused(errors.SYNTAX_ERROR)
            seen_px = True
            expiry_ms = int(number)
        else:
            raise _Refused(errors.SYNTAX_ERROR)
    return _SetOptions(condition, expiry_ms)


def _parse_timestamp(text: str | None) -> Hlc | None:
    if text is None:
        return None
    try:
        return Hlc.parse(text)
    except HlcError as exc:
        raise _Refused(errors.MALFORMED_TIMESTAMP) from exc


_ARITY = {b"GET": (2, 2), b"DEL": (2, 2), b"VDEL": (3, 3), b"KEYNOTIFY": (2, 3)}
_CRLF = b"\r\n"
_OK_REPLY = encode_response(OK)
_MAX_DIGITS = 19  # as resp3's decoder: longer numbers are refused
_MAX_ARGS = 1 << 20


def _decode_request(payload: bytes) -> list[bytes]:
    """`decode_request(payload)`, with a fast path for the well-formed request.

    The generic RESP3 decoder was the largest cost of the store itself in the benchmark
    (tests/bench/bench_store.py). This path accepts only `*<n>\r\n` followed by exactly n
    `$<len>\r\n<bytes>\r\n` and nothing else, with the same limits as the generic decoder;
    anything else goes to `decode_request`, so results and errors stay the same.
    """
    if type(payload) is bytes and payload[:1] == b"*":  # the generic decoder copies others
        end = payload.find(_CRLF)
        digits = payload[1:end]
        if end > 0 and len(digits) <= _MAX_DIGITS and digits.isdigit():
            count = int(digits)
            if 0 < count <= _MAX_ARGS:
                args = []
                pos = end + 2
                for _ in range(count):
                    if payload[pos : pos + 1] != b"$":
                        break
                    end = payload.find(_CRLF, pos)
                    digits = payload[pos + 1 : end]
                    if end < 0 or len(digits) > _MAX_DIGITS or not digits.isdigit():
                        break
                    start = end + 2
                    pos = start + int(digits)
                    if payload[pos : pos + 2] != _CRLF:
                        break
                    args.append(payload[start:pos])
                    pos += 2
                else:
                    if pos == len(payload):
                        return args
    return decode_request(payload)


class StateStore:
    def __init__(
        self,
        wall_clock: WallClock,
        monotonic_clock: MonotonicClock,
        *,
        node_id: str = "statestore",
        quota: int | None = None,
        authorizer: Authorizer | None = None,
        max_drift_ms: int = MAX_CLOCK_DRIFT_MS,
        journal: Journal | None = None,
        limits: StoreLimits | None = None,
    ) -> None:
        self.limits = limits or StoreLimits()
        self.clock = HybridLogicalClock(node_id, wall_clock, max_drift_ms)
        self._wall_clock = wall_clock
        self._monotonic = monotonic_clock
        self.quota = quota
        self._authorizer = authorizer
        self._max_drift_ms = max_drift_ms
        self.journal = journal
        self._entries: dict[bytes, Entry] = {}
        # key -> its registrations; every registration of a name refers to the one name
        # object kept here (a key name may be as long as a packet), not to a copy of its own.
        self._watchers: dict[bytes, _Watch] = {}
        self._watched_by: dict[str, set[bytes]] = {}
        self._registered_bytes: dict[str, int] = {}  # of each client's registered names
        # (deadline, key); stale when the key was rewritten or deleted since, skipped then.
        self._deadlines: list[tuple[int, bytes]] = []
        # With a journal: (record number, key, its entry before) of each change not yet kept,
        # to take it back if its record cannot be (``take_back``).
        self._unkept: deque[tuple[int, bytes, Entry | None]] = deque()

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, key: bytes) -> Entry | None:
        return self._entries.get(key)

    def entries(self) -> dict[bytes, Entry]:
        """The live keys (the store's own dict: read it, do not change it)."""
        return self._entries

    def registrations(self, client_id: str) -> set[bytes]:
        return set(self._watched_by.get(client_id, ()))

    def next_expiry_ms(self) -> int | None:
        """The monotonic deadline of the key that expires first."""
        self._drop_stale_deadlines()
        return self._deadlines[0][0] if self._deadlines else None

    def _drop_stale_deadlines(self) -> None:
        while self._deadlines:
            deadline, key = self._deadlines[0]
            entry = self._entries.get(key)
            if entry is not None and entry.expires_at_ms == deadline:
                return
            heapq.heappop(self._deadlines)

    # ------------------------------------------------------------------ events

    def handle(
        self,
        client_id: str,
        payload: bytes,
        timestamp: str | None = None,
        fencing_token: str | None = None,
    ) -> Outcome:
        """Executes one request. `timestamp`/`fencing_token` are the `__ts`/`__ft` texts."""
        # Without deadlines expire() has nothing to do; skipping it saves a clock read.
        notifications = self.expire() if self._deadlines else []
        try:
            outcome = self._execute(client_id, payload, timestamp, fencing_token)
        except _Refused as refused:
            outcome = Outcome(Reply(encode_response(ErrorReply(refused.text)), self.clock.current))
        if notifications:
            outcome = Outcome(outcome.reply, notifications + outcome.notifications)
        if self.journal is not None:
            self.journal.observe_clock(self.clock.current)
        return outcome

    def restore(
        self,
        key: bytes,
        value: bytes,
        version: Hlc,
        fencing_token: Hlc | None,
        expires_at_wall_ms: int | None,
    ) -> bool:
        """Puts back a key kept across a restart; False (and nothing kept) if it expired."""
        expires = None
        if expires_at_wall_ms is not None:
            remaining = expires_at_wall_ms - self._wall_clock()
            if remaining <= 0:
                return False
            expires = self._monotonic() + remaining
        self._entries[key] = Entry(value, version, fencing_token, expires)
        if expires is not None:
            heapq.heappush(self._deadlines, (expires, key))
        self.clock.receive(Hlc(version.wall_ms, version.counter, _RESTORED_NODE))
        return True

    def restore_clock(self, bound: Hlc) -> None:
        """Moves the clock past every timestamp handed out before a restart."""
        self.clock.receive(Hlc(bound.wall_ms, bound.counter, _RESTORED_NODE))

    def expire(self) -> list[KeyNotification]:
        """Deletes every key whose deadline has passed, notifying DELETE for each."""
        now = self._monotonic()
        notifications: list[KeyNotification] = []
        self._drop_stale_deadlines()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, key = heapq.heappop(self._deadlines)
            now_ts = self.clock.tick()
            if self.journal is not None:
                self._unkept.append((self.journal.delete(key), key, self._entries[key]))
            del self._entries[key]
            notifications += self._notify(key, Notification("DELETE"), now_ts)
            self._drop_stale_deadlines()
            if self.journal is not None:
                self.journal.observe_clock(self.clock.current)
        return notifications

    def kept(self, record: int) -> None:
        """The journal kept every record up to this number: their changes stay."""
        unkept = self._unkept
        while unkept and unkept[0][0] <= record:
            unkept.popleft()

    def take_back(self, kept: int) -> int:
        """Undoes every change whose record came after ``kept`` (they could not be kept),
        the latest first; returns how many."""
        count = 0
        while self._unkept and self._unkept[-1][0] > kept:
            _, key, before = self._unkept.pop()
            count += 1
            if before is None:
                self._entries.pop(key, None)
                continue
            self._entries[key] = before
            if before.expires_at_ms is not None:
                heapq.heappush(self._deadlines, (before.expires_at_ms, key))
        return count

    def client_gone(self, client_id: str) -> None:
        """The service keeps nothing for an absent client (protocol.md §7)."""
        self._registered_bytes.pop(client_id, None)
        for key in self._watched_by.pop(client_id, set()):
            watchers = self._watchers.get(key)
            if watchers is not None:
                watchers.clients.pop(client_id, None)
                if not watchers.clients:
                    del self._watchers[key]

    # ------------------------------------------------------------------ internals

    def _execute(
        self, client_id: str, payload: bytes, ts_text: str | None, ft_text: str | None
    ) -> Outcome:
        try:
            args = _decode_request(payload)
        except Resp3Error as exc:
            raise _Refused(errors.SYNTAX_ERROR) from exc
        command = args[0].upper()
        if command == b"SET":
            if len(args) < 3:
                raise _Refused(errors.WRONG_NUMBER_OF_ARGUMENTS)
        elif command in _ARITY:
            low, high = _ARITY[command]
            if not low <= len(args) <= high:
                raise _Refused(errors.WRONG_NUMBER_OF_ARGUMENTS)
        else:
            raise _Refused(errors.UNKNOWN_COMMAND)
        key = args[1]
        if not key:
            raise _Refused(errors.KEY_LENGTH_ZERO)
        options = _parse_set_options(args[3:]) if command == b"SET" else None
        if command == b"KEYNOTIFY" and len(args) == 3 and args[2].upper() != b"STOP":
            raise _Refused(errors.SYNTAX_ERROR)
        if len(key) > self.limits.max_key_size and (command == b"SET" or len(args) == 2):
            raise _Refused(KEY_TOO_LONG)  # a SET, or a KEYNOTIFY that is no STOP

        request_ts = _parse_timestamp(ts_text)
        if request_ts is None and command == b"SET":
            raise _Refused(errors.MISSING_TIMESTAMP)
        token = _parse_timestamp(ft_text)
        now = self._wall_clock()
        if request_ts is not None and request_ts.drift_ms(now) > self._max_drift_ms:
            raise _Refused(errors.TIMESTAMP_SKEW)
        if token is not None and token.drift_ms(now) > self._max_drift_ms:
            raise _Refused(errors.FENCING_TOKEN_SKEW)
        if self._authorizer is not None:
            access = Access.READ if command in (b"GET", b"KEYNOTIFY") else Access.WRITE
            if not self._authorizer(client_id, key, access):
                raise _Refused(errors.NOT_AUTHORIZED)
        if command == b"SET" and self.journal is not None and not self.journal.writable():
            raise _Refused(DISK_FAILED)
        if request_ts is not None:
            self.clock.receive(request_ts)

        if command == b"SET":
            assert options is not None
            return self._set(key, args[2], options, token)
        if command == b"GET":
            return self._get(key)
        if command == b"DEL":
            return self._delete(key, None, token)
        if command == b"VDEL":
            return self._delete(key, args[2], token)
        return self._keynotify(client_id, key, stop=len(args) == 3)

    def _check_fencing(self, entry: Entry | None, token: Hlc | None) -> None:
        if entry is None or entry.fencing_token is None:
            return
        if token is None:
            raise _Refused(errors.FENCING_TOKEN_REQUIRED)
        if token < entry.fencing_token:
            raise _Refused(errors.FENCING_TOKEN_LOWER_VERSION)

    def _past_quota(self, key: bytes) -> bool:
        """Whether holding the name ``key`` takes the store past its quota, which bounds the
        names it holds: its keys, and the names registered for notification that are none."""
        if self.quota is None or key in self._entries or key in self._watchers:
            return False
        held = len(self._entries)
        if held + len(self._watchers) >= self.quota:  # counted exactly only near the quota
            held += sum(1 for name in self._watchers if name not in self._entries)
        return held >= self.quota

    def _set(self, key: bytes, value: bytes, options: _SetOptions, token: Hlc | None) -> Outcome:
        entry = self._entries.get(key)
        self._check_fencing(entry, token)
        if entry is not None and (
            options.condition == b"NX" or (options.condition == b"NEX" and entry.value != value)
        ):
            return Outcome(Reply(encode_response(-1), entry.version))
        if entry is None and self._past_quota(key):
            raise _Refused(errors.QUOTA_EXCEEDED)
        version = self.clock.tick()
        stored_token = entry.fencing_token if entry is not None else None
        if token is not None and (stored_token is None or token > stored_token):
            stored_token = token
        expires = None if options.expiry_ms is None else self._monotonic() + options.expiry_ms
        new_entry = Entry(value, version, stored_token, expires)
        if self.journal is not None:
            # First: if it raises, nothing has changed.
            self._unkept.append((self.journal.put(key, new_entry), key, entry))
        self._entries[key] = new_entry
        if expires is not None:
            heapq.heappush(self._deadlines, (expires, key))
        # Built only when someone watches the key: most SETs notify nobody.
        notifications = (
            self._notify(key, Notification("SET", value), version) if key in self._watchers else []
        )
        return Outcome(Reply(_OK_REPLY, version), notifications)

    def _get(self, key: bytes) -> Outcome:
        entry = self._entries.get(key)
        if entry is None:
            return Outcome(Reply(encode_response(None), None))
        return Outcome(Reply(encode_response(entry.value), entry.version))

    def _delete(self, key: bytes, expected: bytes | None, token: Hlc | None) -> Outcome:
        entry = self._entries.get(key)
        self._check_fencing(entry, token)
        now = self.clock.tick()
        result: Response
        if entry is None:
            result = 0
        elif expected is not None and entry.value != expected:
            result = -1
        else:
            if self.journal is not None:
                self._unkept.append((self.journal.delete(key), key, entry))
            del self._entries[key]
            reply = Reply(encode_response(1), now)
            return Outcome(reply, self._notify(key, Notification("DELETE"), now))
        return Outcome(Reply(encode_response(result), now))

    def _keynotify(self, client_id: str, key: bytes, *, stop: bool) -> Outcome:
        watchers = self._watchers.get(key)
        registered = watchers is not None and client_id in watchers.clients
        if not stop and not registered:
            if len(self._watched_by.get(client_id, ())) >= self.limits.max_registrations:
                raise _Refused(TOO_MANY_REGISTRATIONS)
            held = self._registered_bytes.get(client_id, 0)
            if held + len(key) > self.limits.max_registration_bytes:
                raise _Refused(REGISTRATIONS_TOO_LARGE)
            if watchers is None and self._past_quota(key):
                raise _Refused(errors.QUOTA_EXCEEDED)
        now = self.clock.tick()
        if stop:
            if watchers is None or not registered:
                return Outcome(Reply(encode_response(0), now))
            del watchers.clients[client_id]
            if not watchers.clients:
                del self._watchers[key]
            self._watched_by[client_id].discard(key)
            self._registered_bytes[client_id] -= len(key)
            return Outcome(Reply(encode_response(OK), now))
        if watchers is None:
            watchers = self._watchers[key] = _Watch(key)
        if not registered:
            watchers.clients[client_id] = None
            self._watched_by.setdefault(client_id, set()).add(watchers.name)
            self._registered_bytes[client_id] = self._registered_bytes.get(client_id, 0) + len(key)
        return Outcome(Reply(encode_response(OK), now))

    def _notify(self, key: bytes, notification: Notification, ts: Hlc) -> list[KeyNotification]:
        watchers = self._watchers.get(key)
        if watchers is None:
            return []
        # One payload for every watcher: the broker writes it from this one bytes object.
        payload = encode_notification(notification)
        return [KeyNotification(client, key, payload, ts) for client in watchers.clients]
