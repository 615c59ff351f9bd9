"""Real MariaDB master + replica for tests and benchmarks.

`start_pair()` is the launcher: two fresh `mariadbd` processes under a short /tmp
directory, GTID replication wired, an application user created. The benchmark
`benchmarks/store_saves_mysql.py` imports it; the fixtures below start one pair per
test session and give every test a fresh database with the store schema in place.
"""

from __future__ import annotations

import itertools
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pymysql
import pytest

from tests.services.ports import free_port, require_service, stop_process

MARIADBD = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
INSTALL_DB = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
APP_USER = "kiteq"
APP_PASSWORD = "kiteq-pw"
REPL_USER = "repl"
REPL_PASSWORD = "repl-pw"
DATABASE_PREFIX = "kt"  # the application user may use (and create) databases named kt_*


def _tail(path: Path, lines: int = 20) -> str:
    """The end of a server log, for error messages (the directory is removed afterwards)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({path}: {exc})"


def mariadb_available() -> bool:
    return Path(MARIADBD).exists() and Path(INSTALL_DB).exists()


@dataclass
class MariaDBServer:
    """One mariadbd on a data directory it owns; stopped and started by pid."""

    name: str
    server_id: int
    base: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.base / "sock"

    @property
    def tmpdir(self) -> Path:
        """Each server's own: two servers sharing /tmp can remove each other's temp tables."""
        return self.base / "tmp"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def install(self) -> subprocess.Popen[bytes]:
        """Start `mariadb-install-db` (the caller waits, so two can run side by side)."""
        return subprocess.Popen(
            [
                INSTALL_DB,
                "--no-defaults",
                "--user=root",
                f"--tmpdir={self.tmpdir}",
                f"--datadir={self.base / 'data'}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.base / "install.log").open("wb"),
        )

    def start(self, timeout: float = 30.0) -> None:
        """Run mariadbd and wait until root can log in over the socket."""
        if self.running:
            return
        log = (self.base / "mariadbd.log").open("ab")
        self.proc = subprocess.Popen(
            [
                MARIADBD,
                "--no-defaults",
                "--user=root",
                f"--datadir={self.base / 'data'}",
                f"--tmpdir={self.tmpdir}",
                f"--socket={self.socket}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--server-id={self.server_id}",
                "--log-bin=mysql-bin",
                "--binlog-format=ROW",
                # What docs/mysql-store.md asks of a master: a commit synced to the binary log
                # (MariaDB's default, 0, lets a machine crash lose acknowledged saves, and leaves
                # the kernel hundreds of MB of log to write back at once: commits stalled 0.5-1 s
                # in the end_to_end benchmark), and row images without the body's before-image.
                "--sync-binlog=1",
                "--binlog-row-image=MINIMAL",
                f"--pid-file={self.base / 'mariadbd.pid'}",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=128M",
                "--max-connections=500",
                # The replica's connect and read timeout to its master: a connection left
                # hanging by a crashed master is retried after 5 s, not the default 60 s
                # (CI once saw replication stuck past the 30 s wait after a master SIGKILL).
                "--slave-net-timeout=5",
            ],
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} mariadbd exited with {self.proc.returncode}:\n{_tail(self.base / 'mariadbd.log')}"
                )
            try:
                self.connect().close()
                return
            except pymysql.err.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """Clean shutdown (SIGTERM); a paused server is resumed first so it can obey."""
        if self.proc is not None:
            self.resume()
            stop_process(self.proc, signal.SIGTERM, timeout=30.0)

    def kill(self) -> None:
        """Crash it (SIGKILL): what was committed must survive, the rest may not."""
        if self.proc is not None:
            stop_process(self.proc, signal.SIGKILL)

    def pause(self) -> None:
        """Freeze it (SIGSTOP): connections stay open and nothing answers, like a hung host."""
        if self.running:
            self.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]

    def resume(self) -> None:
        if self.running:
            self.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def connect(self, database: str | None = None) -> pymysql.connections.Connection:
        return pymysql.connect(unix_socket=str(self.socket), user="root", database=database, autocommit=True)

    def execute(self, *statements: str) -> list[tuple[object, ...]]:
        """Run statements as root; the rows of the last one."""
        conn = self.connect()
        try:
            with conn.cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement)
                return list(cursor.fetchall())
        finally:
            conn.close()


@dataclass
class MariaDBPair:
    """A master and a replica that follows it by GTID."""

    root: Path
    master: MariaDBServer
    replica: MariaDBServer
    user: str = APP_USER
    password: str = APP_PASSWORD
    _names: Iterator[int] = field(default_factory=itertools.count)

    def uri(self, database: str, **options: object) -> str:
        query = "&".join([f"replica={self.replica.address}", *(f"{k}={v}" for k, v in options.items())])
        return f"mysql://{self.user}:{self.password}@{self.master.address}/{database}?{query}"

    def new_database(self) -> str:
        """A database name not used before in this pair (created later by init_schema)."""
        return f"{DATABASE_PREFIX}_{next(self._names)}"

    def replica_status(self) -> dict[str, object]:
        conn = self.replica.connect()
        try:
            with conn.cursor(pymysql.cursors.DictCursor) as cursor:
                cursor.execute("SHOW SLAVE STATUS")
                return cursor.fetchone() or {}
        finally:
            conn.close()

    def wait_replicating(self, timeout: float = 30.0) -> None:
        """Until the replica's both threads run and it has applied all the master wrote."""
        deadline = time.monotonic() + timeout
        position = self.master.execute("SELECT @@global.gtid_binlog_pos")[0][0]
        while True:
            status = self.replica_status()
            if status.get("Slave_IO_Running") == "Yes" and status.get("Slave_SQL_Running") == "Yes":
                waited = self.replica.execute(f"SELECT MASTER_GTID_WAIT('{position}', 1)")[0][0]
                if waited == 0:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"replica not replicating after {timeout} s: {status}\n"
                    f"master log:\n{_tail(self.master.base / 'mariadbd.log')}\n"
                    f"replica log:\n{_tail(self.replica.base / 'mariadbd.log')}"
                )
            time.sleep(0.1)

    def ensure_running(self) -> None:
        """Bring back whatever a test stopped or paused, and wait until replication is healthy."""
        self.master.resume()
        self.replica.resume()
        self.master.start()
        self.replica.start()
        self.wait_replicating()

    def close(self) -> None:
        """Kill both (their data is deleted next: a clean shutdown would only cost seconds)."""
        self.replica.kill()
        self.master.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def start_pair(root: Path | None = None) -> MariaDBPair:
    """Install, start and wire a fresh master + replica; about 3 s on two cores.

    `root` must be short: unix socket paths are limited to 107 bytes.
    """
    root = root or Path(tempfile.mkdtemp(prefix="kq-maria-", dir="/tmp"))
    servers = []
    for name, server_id in (("master", 1), ("replica", 2)):
        (root / name / "tmp").mkdir(parents=True)
        servers.append(MariaDBServer(name, server_id, root / name, free_port()))
    master, replica = servers
    pair = MariaDBPair(root, master, replica)
    try:
        installs = [server.install() for server in servers]
        for server, install in zip(servers, installs, strict=True):
            if install.wait(120) != 0:
                raise RuntimeError(
                    f"mariadb-install-db failed for {server.name}:\n{_tail(server.base / 'install.log')}"
                )
        for server in servers:
            server.start()
        master.execute(
            f"CREATE USER '{REPL_USER}'@'%' IDENTIFIED BY '{REPL_PASSWORD}'",
            f"GRANT REPLICATION SLAVE ON *.* TO '{REPL_USER}'@'%'",
            f"CREATE USER '{APP_USER}'@'%' IDENTIFIED BY '{APP_PASSWORD}'",
            # What docs/mysql-store.md asks for: its databases, and replica status.
            f"GRANT ALL PRIVILEGES ON `{DATABASE_PREFIX}\\_%`.* TO '{APP_USER}'@'%'",
            f"GRANT SLAVE MONITOR ON *.* TO '{APP_USER}'@'%'",
        )
        replica.execute(
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={master.port}, "
            f"MASTER_USER='{REPL_USER}', MASTER_PASSWORD='{REPL_PASSWORD}', "
            "MASTER_CONNECT_RETRY=1, MASTER_USE_GTID=slave_pos",
            "START SLAVE",
        )
        pair.wait_replicating()
    except BaseException:
        pair.close()
        raise
    return pair


@pytest.fixture(scope="session")
def mariadb_pair() -> Iterator[MariaDBPair]:
    """One master + replica for the whole session (skipped locally without mariadbd)."""
    require_service(mariadb_available(), "MariaDB (mariadbd)")
    pair = start_pair()
    try:
        yield pair
    finally:
        pair.close()


@pytest.fixture
def mariadb(mariadb_pair: MariaDBPair) -> Iterator[MariaDBPair]:
    """The session pair, for tests that stop or kill a server: restored afterwards."""
    yield mariadb_pair
    mariadb_pair.ensure_running()


@pytest.fixture
async def mysql_store_uri(mariadb_pair: MariaDBPair) -> str:
    """A URI on a fresh database with the schema initialised (the contract suite's store)."""
    # Imported here: this plugin loads for every test run, the store's drivers only when needed.
    from stores.mysql import init_schema

    uri = mariadb_pair.uri(mariadb_pair.new_database())
    await init_schema(uri)
    return uri


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that runs on MariaDB `mysql`, including the contract suite's mysql case."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "mysql_store_uri" in getattr(item, "fixturenames", ()) or params.get("store_uri") == "mysql":
            item.add_marker(pytest.mark.mysql)
