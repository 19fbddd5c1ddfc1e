"""Private Postgres and Redis servers on free loopback ports, for tests that kill or restart
them, and for machines where the shared ones are not running."""

from __future__ import annotations

import contextlib
import glob
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

# How many ports a private Postgres tries for its first start.
PORT_TRIES = 5


# How many ports below the kernel's ephemeral range a port is drawn from.
PRIVATE_SPAN = 12000


def ephemeral_low() -> int:
    """The first port the kernel gives outgoing connections as their local ports."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def candidate_ports() -> list[int]:
    """Ports below the ephemeral range, in random order: a server is started on its port a
    moment after the port is chosen (or listens on it again after an outage), and a port of the
    ephemeral range may be taken meanwhile by any outgoing connection (EADDRINUSE, seen on CI)."""
    low = ephemeral_low()
    ports = list(range(max(1024, low - PRIVATE_SPAN), low))
    random.shuffle(ports)
    return ports


def free_port() -> int:
    """A loopback port nothing holds now, drawn below the ephemeral range."""
    for port in candidate_ports()[:500]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every one tried is held: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reachable(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pg_bin(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if not found:
        raise RuntimeError(f"{name} not found: install PostgreSQL (apt install postgresql)")
    return found


def _as_postgres(argv: list[str]) -> list[str]:
    # Postgres refuses to run as root: drop to the postgres user when we are root.
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


class PrivatePostgres:
    """A throwaway cluster: initdb, start, stop, restart; trust auth, fsync off.

    As root the cluster runs as the `postgres` user, which must reach its directory: without a
    `base`, a fresh directory under the system temp dir is used (and removed by `remove`).
    `settings` are extra server settings (`-c name=value`), given after the defaults so they
    override them (the bench preloads pg_stat_statements and may turn fsync back on)."""

    def __init__(
        self,
        base: Path | None = None,
        port: int | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        if base is None:
            base = Path(tempfile.mkdtemp(prefix="liyagent-pg-"))
            base.chmod(0o755)
        self.base = base
        self.data = base / "pgdata"
        self.sock = base / "sock"
        self.port = port or free_port()
        # A port this cluster chose itself may be taken before its first start (initdb takes
        # seconds, and the kernel hands the same port to another process's connection):
        # that start then takes another.
        self._port_chosen = port is None
        self._started = False
        self.settings = dict(settings or {})
        spaced = [f"{k}={v}" for k, v in self.settings.items() if any(c.isspace() for c in k + v)]
        if spaced:
            raise ValueError(f"server settings cannot hold whitespace: {', '.join(spaced)}")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def init(self) -> PrivatePostgres:
        self.base.mkdir(parents=True, exist_ok=True)
        self.sock.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
            shutil.chown(self.sock, "postgres")
        subprocess.run(
            _as_postgres(
                [pg_bin("initdb"), "-U", "postgres", "--auth=trust", "-D", str(self.data)]
            ),
            check=True,
            capture_output=True,
        )
        return self

    def start(self) -> PrivatePostgres:
        """Start the cluster; its first start on a port it chose and found taken starts it on
        another (`PORT_TRIES` in all); a restart keeps its port."""
        log = self.base / "pg.log"
        for attempt in range(1, PORT_TRIES + 1):
            seen = log.stat().st_size if log.exists() else 0
            try:
                self._pg_ctl_start()
            except subprocess.CalledProcessError:
                taken = b"Address already in use" in log.read_bytes()[seen:]
                if not (taken and self._port_chosen and not self._started) or (
                    attempt == PORT_TRIES
                ):
                    raise
                self.port = free_port()
                continue
            self._started = True
            return self
        raise AssertionError("unreachable")

    def _pg_ctl_start(self) -> None:
        opts = (
            f"-p {self.port} -k {self.sock} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        )
        opts += "".join(f" -c {name}={value}" for name, value in self.settings.items())
        subprocess.run(
            _as_postgres(
                [
                    pg_bin("pg_ctl"),
                    "-D",
                    str(self.data),
                    "-o",
                    opts,
                    "-w",
                    "-l",
                    str(self.base / "pg.log"),
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
        )

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            _as_postgres([pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]),
            capture_output=True,
        )

    def replica_of(self, primary: PrivatePostgres) -> PrivatePostgres:
        """Make this cluster a streaming replica of `primary` (running): `pg_basebackup -R`
        copies it (after a fast checkpoint: a spread one waits minutes) and writes the standby
        settings; `start` then starts it as a hot standby."""
        self.base.mkdir(parents=True, exist_ok=True)
        self.sock.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
            shutil.chown(self.sock, "postgres")
        argv = [pg_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port)]
        argv += ["-U", "postgres", "-D", str(self.data), "-R", "-X", "stream", "-c", "fast"]
        subprocess.run(_as_postgres(argv), check=True, capture_output=True)
        return self

    def kill(self) -> None:
        """SIGKILL the postmaster (no shutdown, no goodbye to its clients), as a host dies;
        its backends end as they notice, and its port closes."""
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, 9)
        deadline = time.monotonic() + 10
        while reachable("127.0.0.1", self.port, 0.2) and time.monotonic() < deadline:
            time.sleep(0.05)

    def promote(self) -> None:
        """Promote this standby to a primary and wait until it takes writes."""
        subprocess.run(
            _as_postgres([pg_bin("pg_ctl"), "-D", str(self.data), "-w", "promote"]),
            check=True,
            capture_output=True,
        )

    def remove(self) -> None:
        """Stop the cluster and delete its files."""
        self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


class PrivateRedis:
    """A throwaway Redis that keeps nothing on disk (a restart comes back empty); with
    `replica_of`, a replica of the Redis on that loopback port."""

    def __init__(self, base: Path, port: int | None = None, replica_of: int | None = None) -> None:
        self.base = base
        self.port = port or free_port()
        self.replica_of = replica_of
        self.pidfile = base / f"redis-{self.port}.pid"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        self.base.mkdir(parents=True, exist_ok=True)
        replica = (
            [] if self.replica_of is None else ["--replicaof", "127.0.0.1", str(self.replica_of)]
        )
        _start_redis(
            [
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--pidfile",
                str(self.pidfile),
                "--dir",
                str(self.base),
                *replica,
            ],
            self.port,
        )
        return self

    def stop(self) -> None:
        """SIGKILL the server (no goodbye to its clients) and wait until its port is closed."""
        _kill(self.pidfile, self.port)


class PrivateSentinel:
    """A throwaway Redis Sentinel on a free loopback port watching one master, with short
    timings (`down_after_ms`, `failover_timeout_ms`) so a failover takes seconds."""

    def __init__(
        self,
        base: Path,
        master_port: int,
        master_name: str = "liyagent",
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
    ) -> None:
        self.base = base
        self.port = free_port()
        self.pidfile = base / f"sentinel-{self.port}.pid"
        self.conf = base / f"sentinel-{self.port}.conf"
        self.lines = [
            f"sentinel monitor {master_name} 127.0.0.1 {master_port} {quorum}",
            f"sentinel down-after-milliseconds {master_name} {down_after_ms}",
            f"sentinel failover-timeout {master_name} {failover_timeout_ms}",
            f"sentinel parallel-syncs {master_name} 1",
            f"logfile {base / f'sentinel-{self.port}.log'}",  # what it saw, for a failed test
        ]

    @property
    def url(self) -> str:
        return f"sentinel://127.0.0.1:{self.port}"

    def start(self) -> PrivateSentinel:
        self.base.mkdir(parents=True, exist_ok=True)
        # Sentinel rewrites its file as it learns the other Sentinels and replicas.
        self.conf.write_text("\n".join(self.lines) + "\n")
        _start_redis(
            [
                str(self.conf),
                "--sentinel",
                "--port",
                str(self.port),
                "--pidfile",
                str(self.pidfile),
            ],
            self.port,
        )
        return self

    def stop(self) -> None:
        _kill(self.pidfile, self.port)


def _start_redis(args: list[str], port: int) -> None:
    server = shutil.which("redis-server")
    if not server:
        raise RuntimeError("redis-server not found: install Redis (apt install redis-server)")
    if args and not args[0].startswith("--"):  # a config file comes first
        args = [args[0], "--daemonize", "yes", "--bind", "127.0.0.1", *args[1:]]
    else:
        args = ["--daemonize", "yes", "--bind", "127.0.0.1", *args]
    subprocess.run([server, *args], check=True)
    deadline = time.monotonic() + 10
    while not reachable("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.05)


def _kill(pidfile: Path, port: int) -> None:
    with contextlib.suppress(OSError, ValueError):
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 9)
        deadline = time.monotonic() + 5
        while reachable("127.0.0.1", port, 0.2) and time.monotonic() < deadline:
            time.sleep(0.05)
