"""The state store hosted inside our own MQTT 5 broker, in this process."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from types import TracebackType

from agent.client.shown import show_key
from agent.emulator.authn import Authenticator
from agent.emulator.authz import Access, AuthorizationRules, ClientIdentity
from agent.emulator.broker import Broker, DisconnectReason
from agent.emulator.limits import BrokerLimits, StoreLimits
from agent.emulator.persistence import FsyncPolicy, StoreJournal
from agent.emulator.service import StoreService, monotonic_ms, wall_clock_ms
from agent.emulator.store import Authorizer, StateStore
from agent.protocol import topics

log = logging.getLogger(__name__)

# MQTT reason code "Protocol Error": the real service disconnects clients that ask for a
# forbidden response topic.
_PROTOCOL_ERROR = 0x82
# How often a journal that failed to write tries again (persistence.StoreJournal.retry).
_JOURNAL_RETRY_S = 1.0


def _warn_of_unproven_users(
    rules: AuthorizationRules | None, authenticator: Authenticator | None
) -> None:
    """Rules that name users mean something only if user names are proven (`authn.py`)."""
    names = [] if rules is None else rules.named_users()
    if not names:
        return
    if authenticator is None:
        log.warning(
            "the rules name users (%s) but nothing verifies user names (no --users): "
            "any client may claim any of them",
            ", ".join(names),
        )
    elif authenticator.users is None:
        log.warning(
            "the rules name users (%s) but no client can prove a user name (no --users): "
            "those grants go to nobody",
            ", ".join(names),
        )


class EmbeddedStateStore:
    """`async with EmbeddedStateStore() as emulator:` serves at `emulator.url`.

    ``authorizer`` decides by client id and key alone (``--deny-prefix``); ``rules`` are the
    authorization rules of the real broker, which also see the client's user name and
    certificate subject (and govern topics too). A request must pass both.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        quota: int | None = None,
        authorizer: Authorizer | None = None,
        rules: AuthorizationRules | None = None,
        authenticator: Authenticator | None = None,
        ssl_context: ssl.SSLContext | None = None,
        limits: BrokerLimits | None = None,
        data_dir: Path | None = None,
        fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
        store_limits: StoreLimits | None = None,
    ) -> None:
        self.broker = Broker(
            host,
            port,
            limits=limits,
            ssl_context=ssl_context,
            authenticator=authenticator,
            authorizer=rules,
        )
        self._authorizer = authorizer
        self._rules = rules
        key_authorizer = self._may_access if authorizer is not None or rules is not None else None
        self.journal = (
            None if data_dir is None else StoreJournal(data_dir, wall_clock_ms, monotonic_ms, fsync)
        )
        self.store = StateStore(
            wall_clock_ms,
            monotonic_ms,
            quota=quota,
            authorizer=key_authorizer,
            journal=self.journal,
            limits=store_limits,
        )
        self._journal_retry: asyncio.TimerHandle | None = None
        self.service = StoreService(
            self.store,
            self.broker.publish,
            lambda client_id: self.broker.disconnect_client(client_id, _PROTOCOL_ERROR),
        )
        self.broker.intercept(topics.INVOKE_TOPIC, self.service.on_request)
        self.broker.on_disconnect(self._client_gone)
        _warn_of_unproven_users(rules, authenticator)

    def _may_access(self, client_id: str, key: bytes, access: Access) -> bool:
        if self._authorizer is not None and not self._authorizer(client_id, key, access):
            return False
        if self._rules is None:
            return True
        identity = self.broker.identity(client_id) or ClientIdentity(client_id)
        allowed = self._rules.may_access_key(identity, key, access)
        if not allowed:
            log.info(
                "%s may not %s key %s: no rule grants it", client_id, access.value, show_key(key)
            )
        return allowed

    def _client_gone(self, client_id: str, reason: DisconnectReason) -> None:
        self.service.on_client_gone(client_id)

    @property
    def host(self) -> str:
        return self.broker.host

    @property
    def port(self) -> int:
        return self.broker.port

    @property
    def url(self) -> str:
        return self.broker.url

    async def start(self) -> None:
        if self.journal is not None:
            await asyncio.to_thread(self._load, asyncio.get_running_loop())
        try:
            await self.broker.start()
        except BaseException:
            if self.journal is not None:
                await asyncio.to_thread(self.journal.close)  # and its directory is free
            raise
        if self.journal is not None:
            self._retry_journal()
        log.info("state store serving at %s", self.url)

    def _retry_journal(self) -> None:
        assert self.journal is not None
        self.journal.retry()  # nothing to do unless a write failed
        loop = asyncio.get_running_loop()
        self._journal_retry = loop.call_later(_JOURNAL_RETRY_S, self._retry_journal)

    def _load(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self.journal is not None
        loaded = self.journal.load()
        kept = sum(
            self.store.restore(key, e.value, e.version, e.fencing_token, e.expires_at_wall_ms)
            for key, e in loaded.entries.items()
        )
        if loaded.clock_bound is not None:
            self.store.restore_clock(loaded.clock_bound)
        self.journal.open(self.store.entries, self.store.clock.current, self.service.on_kept, loop)
        log.info(
            "%d keys loaded from %s (%d expired meanwhile)",
            kept,
            self.journal.path,
            len(loaded.entries) - kept,
        )

    async def stop(self) -> None:
        if self._journal_retry is not None:
            self._journal_retry.cancel()
            self._journal_retry = None
        self.service.close()
        await self.broker.stop()
        if self.journal is not None:
            await asyncio.to_thread(self.journal.close)

    async def __aenter__(self) -> EmbeddedStateStore:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
