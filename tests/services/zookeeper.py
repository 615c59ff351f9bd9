"""A real ZooKeeper for tests, run from Debian's jar in a temp dir (see infra notes).

One server per test session (`zookeeper`), and a fresh chroot per test (`zk_uri`) so
tests never see each other's nodes. The server can be stopped and started again on
the same port and data dir, which is how outage tests take ZooKeeper away.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services.ports import free_port, require_service, stop_process

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
SLF4J_JAR = Path("/usr/share/java/slf4j-simple.jar")
# Small ticks make session timeouts short; the max lets clients still ask for 30 s.
TICK_MS = 200
CONFIG = """\
tickTime={tick}
maxSessionTimeout=30000
dataDir={data}
clientPort={port}
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr
"""


def four_letter_word(port: int, word: bytes, timeout: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command and return the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(word)
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperServer:
    """One standalone ZooKeeper; `stop()`/`start()` keep its port and data."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory = directory
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        (directory / "data").mkdir(parents=True, exist_ok=True)
        self.config = directory / "zoo.cfg"
        self.config.write_text(CONFIG.format(tick=TICK_MS, data=directory / "data", port=port))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def uri(self) -> str:
        return f"zk://{self.address}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and return once it serves clients (`srvr` reports a mode)."""
        if self.running:
            return
        log = open(self.directory / "zookeeper.log", "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [
                "java",
                "-Xmx256m",
                "-XX:TieredStopAtLevel=1",
                "-XX:+UseSerialGC",
                "-cp",
                f"{ZOOKEEPER_JAR}:{SLF4J_JAR}",
                "org.apache.zookeeper.server.ZooKeeperServerMain",
                str(self.config),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"ZooKeeper exited with {self.proc.returncode}; see {self.directory}/zookeeper.log"
                )
            try:
                if "Mode:" in four_letter_word(self.port, b"srvr"):
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"ZooKeeper on {self.address} not ready after {timeout} s")

    def stop(self) -> None:
        """Kill the server by pid (SIGKILL: an outage, not a goodbye)."""
        if self.proc is not None:
            stop_process(self.proc, sig=signal.SIGKILL)
            self.proc = None


def zookeeper_available() -> bool:
    return ZOOKEEPER_JAR.exists() and shutil.which("java") is not None


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    require_service(zookeeper_available(), f"ZooKeeper ({ZOOKEEPER_JAR} and java)")
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_uri(zookeeper: ZooKeeperServer) -> str:
    """A registry URI on the shared server with a chroot of its own."""
    zookeeper.start()  # a previous outage test may have left it stopped
    return f"{zookeeper.uri}/test-{uuid.uuid4().hex[:12]}"
