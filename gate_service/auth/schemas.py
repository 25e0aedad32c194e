"""The REST shapes of tokens and audit events."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..text import StorableStr
from .tokens import Scope


class Schema(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scopes: list[Scope] = Field(min_length=1, max_length=3)
    expires_in_days: int | None = Field(default=None, ge=1, le=3650)
    name: StorableStr | None = Field(default=None, max_length=200)


class TokenRead(Schema):
    """A token as listed: never its value."""

    id: uuid.UUID
    name: str | None
    scopes: list[str]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


class TokenCreated(TokenRead):
    project: str
    token: str = Field(description="The bearer token. Shown once: only its hash is stored.")


class TokenList(BaseModel):
    items: list[TokenRead]


class WhoAmI(BaseModel):
    """The calling token, as ``GET /v1/whoami`` answers it: never its value."""

    project: str = Field(description="The project the token belongs to")
    token: TokenRead


class AuditRead(Schema):
    id: int
    at: datetime
    project_id: uuid.UUID | None
    token_id: uuid.UUID | None
    action: str
    detail: dict[str, Any]


class AuditList(BaseModel):
    items: list[AuditRead]
    limit: int
    offset: int
