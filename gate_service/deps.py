"""Request-scoped dependencies, from the app's state (app_state.py, built in the lifespan)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from .app_state import state_of
from .config import Settings
from .db import session_scope


def get_settings(request: Request) -> Settings:
    return state_of(request).settings


def get_sessionmaker(request: Request) -> sessionmaker[Session]:
    return state_of(request).sessions


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
