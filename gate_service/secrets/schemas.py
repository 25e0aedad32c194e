"""The REST shapes of project secrets: a value goes in, and never comes out."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_VALUE_BYTES = 64 * 1024


class SecretPut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: str = Field(
        description=f"The secret's value: UTF-8 text without NUL, at most {MAX_VALUE_BYTES} "
        "bytes. Stored encrypted; no route returns it."
    )

    @field_validator("value")
    @classmethod
    def _fits_an_environment_variable(cls, value: str) -> str:
        # Messages never quote the value: validation errors are answered and logged.
        if "\x00" in value:
            raise ValueError("a secret's value cannot hold a NUL character")
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError("a secret's value must be valid UTF-8 text") from None
        if size > MAX_VALUE_BYTES:
            raise ValueError(f"a secret's value is at most {MAX_VALUE_BYTES} bytes; got {size}")
        return value


class SecretRead(BaseModel):
    """A secret as listed: its name, never its value."""

    model_config = ConfigDict(from_attributes=True)

    name: str
    updated_at: datetime


class SecretStored(SecretRead):
    project: str
    created: bool = Field(description="True when the name was new, False when it was replaced.")


class SecretList(BaseModel):
    project: str
    items: list[SecretRead]
