"""Encryption at rest of project secrets: Fernet (AES-128-CBC + HMAC-SHA256) from `cryptography`.

The key is GATE_SECRETS_KEY, or one made on first use and kept 0600 in
GATE_DATA_DIR/secrets.key, so that `gate serve` works out of the box. Each ciphertext also
names the project and the secret it belongs to, so a row copied into another project or
renamed in the database does not decrypt as that project's secret.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from ..config import Settings
from ..errors import SecretUnreadable

log = logging.getLogger(__name__)

KEY_FILE = "secrets.key"


class SecretsKeyInvalid(ValueError):
    """GATE_SECRETS_KEY (or the key file) does not hold a Fernet key."""


def _key_file(settings: Settings) -> bytes:
    """The key kept under GATE_DATA_DIR, made once (atomically, 0600) if it is not there."""
    directory = settings.runtime_dir()
    path = directory / KEY_FILE
    if not path.exists():
        # Written whole under a private name, then linked into place: a process that loses
        # the race (the API and an embedded worker start together) reads the winner's key,
        # never a half-written file.
        tmp = directory / f".{KEY_FILE}.{os.getpid()}.{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(Fernet.generate_key() + b"\n")
            try:
                os.link(tmp, path)
                log.warning(
                    "made a new secrets key in %s; workers on other hosts need the same key "
                    "(set GATE_SECRETS_KEY on every process)",
                    path,
                )
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
    _warn_if_readable(path)
    return path.read_bytes().strip()


def _warn_if_readable(path: Path) -> None:
    mode = path.stat().st_mode
    if mode & 0o077:
        log.warning("%s is readable by other users (mode %o); chmod 600 it", path, mode & 0o777)


class SecretBox:
    """Encrypts and decrypts the values of project secrets with one Fernet key."""

    def __init__(self, key: bytes | str, *, source: str = "GATE_SECRETS_KEY") -> None:
        try:
            self._fernet = Fernet(key)
        except (ValueError, TypeError):
            raise SecretsKeyInvalid(
                f"{source} does not hold a Fernet key (32 url-safe base64-encoded bytes); make "
                "one with: python3 -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())'"
            ) from None

    @classmethod
    def from_settings(cls, settings: Settings) -> SecretBox:
        if settings.secrets_key is not None:
            return cls(settings.secrets_key.get_secret_value().strip())
        path = settings.runtime_dir() / KEY_FILE
        return cls(_key_file(settings), source=str(path))

    def encrypt(self, project_id: uuid.UUID, name: str, value: str) -> bytes:
        plain = {"project": str(project_id), "name": name, "value": value}
        return self._fernet.encrypt(json.dumps(plain, ensure_ascii=False).encode("utf-8"))

    def decrypt(self, project_id: uuid.UUID, project_name: str, name: str, token: bytes) -> str:
        """The value, or SecretUnreadable naming the secret, the project and the cause."""
        try:
            plain = json.loads(self._fernet.decrypt(token))
        except InvalidToken:
            raise SecretUnreadable(
                f"cannot decrypt secret {name} of project {project_name}: GATE_SECRETS_KEY "
                "differs from the one it was stored with"
            ) from None
        if plain.get("project") != str(project_id) or plain.get("name") != name:
            raise SecretUnreadable(
                f"secret {name} of project {project_name} holds a ciphertext stored for another "
                "project or name; store it again"
            )
        value = plain.get("value")
        if not isinstance(value, str):
            raise SecretUnreadable(f"secret {name} of project {project_name} has no value")
        return value
