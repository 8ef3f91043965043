"""A private PostgreSQL server from the host's Debian packages: its own data directory,
port and password, for a local cluster and for tests."""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

USER = "aenv"
DATABASE = "aenv"
# PostgreSQL refuses to run as root; Debian's package brings this account.
_SERVICE_ACCOUNT = "postgres"


class PostgresError(RuntimeError):
    """The server could not be set up, started or stopped."""


MAX_CONNECTIONS = 1000


def _binary(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise PostgresError(f"{name} not found: install Debian's postgresql package")
    return found[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalPostgres:
    """The server whose data lives in `directory` (made on first start)."""

    directory: Path

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def _password_file(self) -> Path:
        return self.directory / "password"

    @property
    def _port_file(self) -> Path:
        return self.directory / "port"

    def url(self, host: str = "127.0.0.1") -> str:
        password = self._password_file.read_text().strip()
        port = int(self._port_file.read_text())
        return f"postgresql://{USER}:{password}@{host}:{port}/{DATABASE}"

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        if os.geteuid() == 0:
            argv = ["runuser", "-u", _SERVICE_ACCOUNT, "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)

    def _prepare(self) -> None:
        """Make the directory the server may own (and reach, when run for root)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            return
        account = pwd.getpwnam(_SERVICE_ACCOUNT)
        # The service account has to reach its data: directories of ours on the way are
        # opened for traversal (not listing); anyone else's must already be.
        here = self.directory.resolve()
        for directory in (here, *here.parents):
            mode = directory.stat().st_mode
            if mode & 0o001:
                continue
            if directory.stat().st_uid != os.geteuid():
                raise PostgresError(
                    f"{directory} is closed to other users: PostgreSQL runs as "
                    f"'{_SERVICE_ACCOUNT}' and cannot reach {self.directory}"
                )
            directory.chmod(mode | 0o011)
        self.data.mkdir(mode=0o700, exist_ok=True)
        os.chown(self.data, account.pw_uid, account.pw_gid)

    def start(self, port: int | None = None, timeout: float = 60, host: str = "127.0.0.1") -> str:
        """Start the server (initialized on first use), listening on loopback and `host`;
        its URL at `host`. Clients on `host`'s subnet may log in with the password."""
        self._prepare()
        if not (self.data / "PG_VERSION").exists():
            self._initdb()
        if port is None:
            port = int(self._port_file.read_text()) if self._port_file.exists() else free_port()
        self._port_file.write_text(str(port))
        addresses = ",".join(dict.fromkeys(["127.0.0.1", host]))
        # Each node keeps a pool of its own: hundreds of nodes (hollow ones in benchmarks)
        # hold more than the default 100 connections.
        options = f"-c listen_addresses={addresses} -p {port} -k {self.data}"
        options += f" -c max_connections={MAX_CONNECTIONS}"
        log = self.directory / "postgres.log"
        log.touch()
        if os.geteuid() == 0:
            shutil.chown(log, _SERVICE_ACCOUNT)
        started = self._run(
            [_binary("pg_ctl"), "start", "-D", str(self.data), "-l", str(log), "-o", options]
        )
        if started.returncode != 0:
            raise PostgresError(f"pg_ctl start failed: {started.stderr.strip()}")
        self._wait(port, timeout)
        return self.url(host)

    def _initdb(self) -> None:
        password = secrets.token_hex(16)
        secret = self.directory / "initdb-password"
        secret.write_text(password)
        if os.geteuid() == 0:
            shutil.chown(secret, _SERVICE_ACCOUNT)
        try:
            done = self._run(
                [
                    _binary("initdb"),
                    "-D", str(self.data),
                    "-U", USER,
                    "--pwfile", str(secret),
                    "--auth", "scram-sha-256",
                    "-E", "UTF8",
                ]
            )  # fmt: skip
        finally:
            secret.unlink(missing_ok=True)
        if done.returncode != 0:
            raise PostgresError(f"initdb failed: {done.stderr.strip()}")
        with open(self.data / "pg_hba.conf", "a") as hba:
            # Beyond loopback: the subnets the server's own addresses are on (a cluster's
            # bridge), with the password.
            hba.write("host all all samenet scram-sha-256\n")
        self._password_file.write_text(password)
        self._password_file.chmod(0o600)

    def _wait(self, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        ready = [_binary("pg_isready"), "-h", "127.0.0.1", "-p", str(port)]
        while subprocess.run(ready, capture_output=True, check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise PostgresError(f"PostgreSQL did not accept connections on port {port}")
            time.sleep(0.2)
        self._ensure_database(port)

    def _ensure_database(self, port: int) -> None:
        env = {**os.environ, "PGPASSWORD": self._password_file.read_text().strip()}
        base = [_binary("psql"), "-h", "127.0.0.1", "-p", str(port), "-U", USER, "-d"]
        found = subprocess.run(
            [*base, "postgres", "-Atc", f"SELECT 1 FROM pg_database WHERE datname='{DATABASE}'"],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
        if found.returncode != 0:
            raise PostgresError(f"psql failed: {found.stderr.strip()}")
        if found.stdout.strip() != "1":
            made = subprocess.run(
                [*base, "postgres", "-c", f"CREATE DATABASE {DATABASE}"],
                capture_output=True, text=True, env=env, check=False,
            )  # fmt: skip
            if made.returncode != 0:
                raise PostgresError(f"creating the database failed: {made.stderr.strip()}")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists() and self._run(
            [_binary("pg_ctl"), "status", "-D", str(self.data)]
        ).returncode == 0

    def stop(self) -> None:
        """Stop the server (fast shutdown); nothing to do when it is not running."""
        if not self.data.exists() or not (self.data / "postmaster.pid").exists():
            return
        stopped = self._run([_binary("pg_ctl"), "stop", "-D", str(self.data), "-m", "fast"])
        if stopped.returncode != 0 and self.running():
            raise PostgresError(f"pg_ctl stop failed: {stopped.stderr.strip()}")
