"""The pair's leased lock (``AGENT_LOCK__...``)."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LockSettings(BaseModel):
    """The leased lock that makes one instance of a pair active."""

    model_config = ConfigDict(extra="forbid")

    ttl_ms: Annotated[int, Field(ge=300, le=600_000)] = Field(
        default=3000, description="Lease length; renewed every third of it."
    )
    safety_margin_ms: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="The active gives up this long before the lease ends "
        "(default: 10% of the TTL, 50 ms to 1 s).",
    )

    @model_validator(mode="after")
    def _margin_below_ttl(self) -> Self:
        if self.safety_margin_ms is not None and self.safety_margin_ms * 2 >= self.ttl_ms:
            raise ValueError("safety_margin_ms must be less than half of ttl_ms")
        return self
