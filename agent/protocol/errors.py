"""The error texts of the service (protocol.md §2), exact and lower-case."""

from typing import Final

SYNTAX_ERROR: Final = "syntax error"
UNKNOWN_COMMAND: Final = "unknown command"
WRONG_NUMBER_OF_ARGUMENTS: Final = "wrong number of arguments"
KEY_LENGTH_ZERO: Final = "the key length is zero"
MISSING_TIMESTAMP: Final = "missing timestamp"
MALFORMED_TIMESTAMP: Final = "malformed timestamp"
TIMESTAMP_SKEW: Final = (
    "the request timestamp is too far in the future; ensure that the client and broker "
    "system clocks are synchronized"
)
FENCING_TOKEN_SKEW: Final = (
    "the request fencing token timestamp is too far in the future; ensure that the client "
    "and broker system clocks are synchronized"
)
FENCING_TOKEN_REQUIRED: Final = "a fencing token is required for this request"
FENCING_TOKEN_LOWER_VERSION: Final = (
    "the request fencing token is a lower version than the fencing token protecting the resource"
)
QUOTA_EXCEEDED: Final = "the quota has been exceeded"
NOT_AUTHORIZED: Final = "not authorized"

ALL: Final = (
    SYNTAX_ERROR,
    UNKNOWN_COMMAND,
    WRONG_NUMBER_OF_ARGUMENTS,
    KEY_LENGTH_ZERO,
    MISSING_TIMESTAMP,
    MALFORMED_TIMESTAMP,
    TIMESTAMP_SKEW,
    FENCING_TOKEN_SKEW,
    FENCING_TOKEN_REQUIRED,
    FENCING_TOKEN_LOWER_VERSION,
    QUOTA_EXCEEDED,
    NOT_AUTHORIZED,
)
