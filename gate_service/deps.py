"""Request-scoped dependencies built from what the lifespan put on app.state."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from .config import Settings
from .db import session_scope


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_sessionmaker(request: Request) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = request.app.state.sessionmaker
    return factory


def get_session(request: Request) -> Iterator[Session]:
    """One transaction per request: committed when the handler returns, else rolled back."""
    with session_scope(get_sessionmaker(request)) as session:
        yield session


# scope="function": the commit runs when the handler returns, before the answer is sent, so
# a client that acts on a 2xx finds the write there, and a commit that fails answers 500.
# (The default, "request", commits after the response: a revoked token still worked for a
# moment and a new one could be unknown on its first use.)
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_sessionmaker)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
