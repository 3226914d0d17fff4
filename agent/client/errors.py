"""What a state store request can fail with: one type per service error text."""

from __future__ import annotations

from agent.protocol import errors as texts


class StateStoreError(Exception):
    """Base of every error the client raises."""


class RequestTimeout(StateStoreError, TimeoutError):
    """No response within the request's timeout."""


class ResponseLost(RequestTimeout):
    """No response will come to a read (GET, KEYNOTIFY): the connection it went out on
    dropped after the broker acknowledged it, and a clean session keeps nothing for the next
    connection. As after a timeout, only sooner."""


class UnexpectedResponse(StateStoreError):
    """The service answered with something this protocol does not allow here."""


class ServiceError(StateStoreError):
    """`-ERR <text>` from the service; subclasses name the known texts."""

    text: str = ""

    def __init__(self, text: str | None = None) -> None:
        self.text = text if text is not None else type(self).text
        super().__init__(self.text)


class SyntaxErrorReply(ServiceError):
    text = texts.SYNTAX_ERROR


class UnknownCommand(ServiceError):
    text = texts.UNKNOWN_COMMAND


class WrongNumberOfArguments(ServiceError):
    text = texts.WRONG_NUMBER_OF_ARGUMENTS


class KeyLengthZero(ServiceError):
    text = texts.KEY_LENGTH_ZERO


class MissingTimestamp(ServiceError):
    text = texts.MISSING_TIMESTAMP


class MalformedTimestamp(ServiceError):
    text = texts.MALFORMED_TIMESTAMP


class TimestampSkew(ServiceError):
    text = texts.TIMESTAMP_SKEW


class FencingTokenSkew(ServiceError):
    text = texts.FENCING_TOKEN_SKEW


class FencingTokenRequired(ServiceError):
    text = texts.FENCING_TOKEN_REQUIRED


class FencingTokenLowerVersion(ServiceError):
    """A newer owner has written: the caller's fencing token is stale."""

    text = texts.FENCING_TOKEN_LOWER_VERSION


class FencedByAnotherLock(StateStoreError):
    """A fenced write refused while our lease is intact at the store: the key was last
    written with a newer token of another lock (another line's, that serves the same
    key). The key is not ours to write; our lock is not lost."""

    def __init__(self, key: bytes, lock: bytes) -> None:
        super().__init__(
            f"{key.decode(errors='replace')} was last written under another lock than "
            f"{lock.decode(errors='replace')} (another line serves it?)"
        )
        self.key = key


class QuotaExceeded(ServiceError):
    text = texts.QUOTA_EXCEEDED


class NotAuthorized(ServiceError):
    text = texts.NOT_AUTHORIZED


_BY_TEXT: dict[str, type[ServiceError]] = {
    cls.text: cls
    for cls in (
        SyntaxErrorReply,
        UnknownCommand,
        WrongNumberOfArguments,
        KeyLengthZero,
        MissingTimestamp,
        MalformedTimestamp,
        TimestampSkew,
        FencingTokenSkew,
        FencingTokenRequired,
        FencingTokenLowerVersion,
        QuotaExceeded,
        NotAuthorized,
    )
}


def service_error(text: str) -> ServiceError:
    """The error for a `-ERR` text; unknown texts stay a generic ServiceError."""
    cls = _BY_TEXT.get(text)
    return cls() if cls is not None else ServiceError(text)
