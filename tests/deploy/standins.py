"""Stand-ins for the registry images docker-compose.yml names, built here from Debian packages.

This machine has no registry (`docker pull` fails), so `python:3.11-slim` and `postgres:16`
are bootstrapped with debootstrap from apt's own mirror, imported with `docker import`, and
tagged with the names compose uses. Each carries STANDIN_LABEL with a hash of its recipe:
an image with the right hash is reused, one with another hash is rebuilt, and an image of
that name WITHOUT the label (a real one someone pulled) is never touched.

- `python:3.11-slim`: Debian bookworm's python3 (3.11), pip and venv, with `python` and
  `pip` on PATH and no EXTERNALLY-MANAGED marker, so `pip install` works as in the official
  image.
- `postgres:16`: Debian bookworm's PostgreSQL (15: the stand-in only has to speak the
  protocol) with an entrypoint honouring POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB
  (initdb on first start into /var/lib/postgresql/data, listen on all addresses, password
  authentication) and `pg_isready` on PATH.

Run as a script to build them ahead of the test: `python3 -m tests.deploy.standins`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gate_service.sandbox.docker.runner_image import apt_mirror

STANDIN_LABEL = "gate.standin"
SUITE = "bookworm"
PG_MAJOR = "15"  # bookworm's PostgreSQL

POSTGRES_ENTRYPOINT = r"""#!/bin/sh
# Stand-in for the official postgres image's entrypoint: the same environment variables.
set -eu
PGDATA="${PGDATA:-/var/lib/postgresql/data}"
export PGDATA
if [ "${1:-postgres}" != postgres ]; then
  exec "$@"
fi
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown -R postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
  user="${POSTGRES_USER:-postgres}"
  db="${POSTGRES_DB:-$user}"
  pwfile="$(mktemp)"
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -E UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host=scram-sha-256
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  if [ "$db" != postgres ]; then
    # A private socket directory and no TCP while initialising: pg_isready (the compose
    # health check) only answers once the real server below is up.
    init_sock="$(mktemp -d)"
    pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -k $init_sock" start
    createdb -h "$init_sock" -U "$user" "$db"
    pg_ctl -D "$PGDATA" -w -m fast stop
    rmdir "$init_sock"
  fi
fi
# `docker stop` sends TERM, which postgres reads as a smart shutdown that waits for every
# client; the official image asks for INT (STOPSIGNAL, which `docker import` cannot set).
postgres -D "$PGDATA" &
pid=$!
trap 'kill -INT "$pid" 2>/dev/null' TERM INT
while :; do
  wait "$pid" && exit 0 || status=$?
  kill -0 "$pid" 2>/dev/null || exit "$status"
done
"""

POSTGRES_BIN = f"/usr/lib/postgresql/{PG_MAJOR}/bin"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Standin:
    tag: str
    packages: tuple[str, ...]
    changes: tuple[str, ...]  # `docker import --change` instructions
    files: dict[str, tuple[str, int]] = field(default_factory=dict)  # path -> (text, mode)
    remove: tuple[str, ...] = ()  # paths (globs) deleted from the root file system

    def digest(self) -> str:
        recipe = json.dumps(
            [SUITE, self.tag, self.packages, self.changes, self.files, self.remove],
            sort_keys=True,
        )
        return hashlib.sha256(recipe.encode()).hexdigest()[:16]


PYTHON = Standin(
    tag="python:3.11-slim",
    packages=("python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates"),
    changes=(
        f"ENV PATH={BASE_PATH}",
        "ENV LANG=C.UTF-8",
        'CMD ["python3"]',
    ),
    # The official image's pip installs into its interpreter; Debian's refuses (PEP 668).
    remove=("usr/lib/python3*/EXTERNALLY-MANAGED",),
)

POSTGRES = Standin(
    tag="postgres:16",
    packages=("postgresql", "ca-certificates"),
    changes=(
        f"ENV PATH={POSTGRES_BIN}:{BASE_PATH}",
        "ENV LANG=C.UTF-8",
        "ENV PGDATA=/var/lib/postgresql/data",
        "VOLUME /var/lib/postgresql/data",
        "EXPOSE 5432",
        'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]',
        'CMD ["postgres"]',
    ),
    files={"usr/local/bin/docker-entrypoint.sh": (POSTGRES_ENTRYPOINT, 0o755)},
    # The cluster Debian's package makes at install time: ours is made at first start.
    remove=(f"var/lib/postgresql/{PG_MAJOR}", f"etc/postgresql/{PG_MAJOR}"),
)

STANDINS = (PYTHON, POSTGRES)


class StandinError(RuntimeError):
    pass


def image_labels(tag: str) -> dict[str, str] | None:
    """The image's labels, or None when there is no image of that name."""
    proc = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout or "null") or {}


def status(standin: Standin) -> str:
    """`current`, `stale` (ours, another recipe), `missing` or `foreign` (a real image)."""
    labels = image_labels(standin.tag)
    if labels is None:
        return "missing"
    if STANDIN_LABEL not in labels:
        return "foreign"
    return "current" if labels[STANDIN_LABEL] == standin.digest() else "stale"


def _unmount_under(path: Path) -> None:
    """Unmount what debootstrap may have left mounted in a chroot (proc, sys, dev)."""
    prefix = str(path.resolve()) + "/"
    with open("/proc/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", point], check=False)


def _build(standin: Standin, mirror: str, log: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="gate-standin-", dir="/var/tmp"))
    try:
        rootfs = work / "rootfs"
        with log.open("ab") as out:
            subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(standin.packages)}",
                    SUITE,
                    str(rootfs),
                    mirror,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                check=True,
            )
        for pattern in standin.remove:
            for path in rootfs.glob(pattern):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        # Package lists and downloaded .debs: the official images ship without them.
        for cache in ("var/lib/apt/lists", "var/cache/apt/archives"):
            for path in (rootfs / cache).glob("*"):
                if path.is_file():
                    path.unlink()
        for rel, (text, mode) in standin.files.items():
            path = rootfs / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(mode)
        tarball = work / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
        changes = [*standin.changes, f"LABEL {STANDIN_LABEL}={standin.digest()}"]
        argv = ["docker", "import"]
        for change in changes:
            argv += ["--change", change]
        subprocess.run(
            [*argv, str(tarball), standin.tag], capture_output=True, text=True, check=True
        )
    finally:
        _unmount_under(work)
        shutil.rmtree(work, ignore_errors=True)


def ensure_standins(standins: tuple[Standin, ...] = STANDINS) -> None:
    """Build every stand-in that is missing or stale, in parallel; leave real images alone."""
    todo = []
    for standin in standins:
        state = status(standin)
        if state == "foreign":
            print(f"{standin.tag}: a real image is present; using it", file=sys.stderr)
        elif state != "current":
            todo.append(standin)
    if not todo:
        return
    if shutil.which("debootstrap") is None:
        raise StandinError("debootstrap is not installed (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise StandinError("building the stand-in images needs root (debootstrap)")
    mirror = apt_mirror()
    log_dir = Path(tempfile.mkdtemp(prefix="gate-standin-logs-", dir="/var/tmp"))
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(todo)) as pool:
        futures = {
            s.tag: pool.submit(_build, s, mirror, log_dir / f"{s.tag.replace(':', '_')}.log")
            for s in todo
        }
    failures = []
    for tag, future in futures.items():
        exc = future.exception()
        if exc is not None:
            path = log_dir / f"{tag.replace(':', '_')}.log"
            tail = path.read_text(errors="replace")[-3000:] if path.exists() else ""
            detail = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else ""
            failures.append(f"{tag}: {exc} {detail or ''}\n{tail}")
    if failures:
        raise StandinError("\n".join(failures))
    shutil.rmtree(log_dir, ignore_errors=True)
    done = ", ".join(s.tag for s in todo)
    print(f"stand-ins built in {time.monotonic() - started:.0f} s: {done}", file=sys.stderr)


if __name__ == "__main__":
    ensure_standins()
