"""TLS on the client port and the admin endpoint, with certificates made by trustme."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import structlog.testing
import trio
import trustme

from kiteq import Binding, Consumer, Message, Producer, sync
from kiteq.client.connection import ClientConnection, Credentials
from kiteq.errors import ConnectionClosed, TLSError
from kiteq.tls import client_context, open_stream
from protocol import Cmd, pb
from protocol.framing import HEADER
from tests.certificates import Certificates, make_certificates
from tests.e2e.test_examples import run_example
from tests.e2e.test_limits import connect, read_all
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until
from tests.procs.runner import ROOT
from tests.wire import RawPeer, header

PAYMENTS = Binding.direct("trade", "pay-succ")


@pytest.fixture
def certs(tmp_path: Path) -> Certificates:
    return make_certificates(tmp_path)


@pytest.fixture
def other_ca(tmp_path: Path) -> Path:
    """A CA that signed nothing of ours."""
    path = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return path


async def test_producer_and_consumer_over_tls_end_to_end(tmp_path: Path, certs: Certificates) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    ca = str(certs.ca_pem)
    async with (
        running_broker(tmp_path, tls=certs.broker_tls()) as broker,
        Consumer(registry, group="sms", bindings=[PAYMENTS], listener=listener, tls=ca),
    ):
        async with Producer(registry, group="orders", topics=["trade"], tls=certs.ca_pem) as producer:
            sent = {await producer.send(Message("trade", "pay-succ", f"order {i}")) for i in range(20)}
            streams = [c.framed.stream for c in producer.pool.connections.values() if c.framed]
        assert streams and all(isinstance(s, trio.SSLStream) and s.version() == "TLSv1.3" for s in streams)
        # The example scripts take the CA as --tls-ca; this one sends "order N paid" as bytes.
        example = await trio.to_thread.run_sync(
            lambda: run_example(
                "producer.py", "--registry", registry, "--count", "3", "--tls-ca", ca, cwd=tmp_path
            )
        )
        assert example.returncode == 0, example.stderr
        sent |= {line.split()[1] for line in example.stdout.splitlines() if line.startswith("stored ")}
        await wait_until(lambda: listener.acked_ids == sent, what="23 messages delivered over TLS")
        assert broker.events.total("stored") == 23
    assert len(sent) == 23
    assert {m.body for m in listener.deliveries} == {f"order {i}" for i in range(20)} | {
        f"order {i} paid".encode() for i in range(3)
    }


async def test_a_broker_certificate_the_client_does_not_trust_raises_tls_error(
    tmp_path: Path, certs: Certificates, other_ca: Path
) -> None:
    registry = registry_uri(tmp_path)
    async with running_broker(tmp_path, tls=certs.broker_tls(), server={"topics": ["trade"]}):
        with (
            structlog.testing.capture_logs() as logs,
            trio.fail_after(5),
            pytest.raises(TLSError, match="certificate is not trusted") as refused,
        ):
            async with Producer(registry, group="orders", topics=["trade"], tls=other_ca):
                pass
    assert "pass tls= the CA that signed it" in str(refused.value)
    # Recorded by the broker pool as a refusal (not retried as a network failure).
    assert [e["error"] for e in logs if e["event"] == "client.refused"] == [str(refused.value)]


async def test_a_plaintext_client_is_closed_unanswered_and_the_broker_keeps_serving(
    tmp_path: Path, certs: Certificates
) -> None:
    registry = registry_uri(tmp_path)
    async with running_broker(tmp_path, tls=certs.broker_tls(), server={"topics": ["trade"]}) as broker:
        with structlog.testing.capture_logs() as logs:
            plain = await connect(broker.address, group="orders")  # sends a ConnMeta in the clear
            answer = await read_all(plain)  # ends when the broker closes the connection
            await plain.aclose()
        assert not answer.startswith(HEADER.pack(1, Cmd.CONN_AUTH_ACK, 0, 0, 0)[:5]), "no ConnAuthAck"
        assert any(e["event"] == "connection.tls_failed" for e in logs)
        assert not broker.groups.peers("orders")
        async with Producer(registry, group="orders", topics=["trade"], tls=certs.ca_pem) as producer:
            await producer.send(Message("trade", "pay-succ", "after the plaintext peer"))
        assert broker.events.total("stored") == 1


async def tls_peer(address: str, certs: Certificates, group: str) -> RawPeer:
    """A raw-frame client over TLS, authenticated as `group`: each `send` is one TLS record."""
    host, _, port = address.rpartition(":")
    peer = RawPeer(await open_stream(host, int(port), client_context(certs.ca_pem)))
    ack = await peer.authenticate(group, "")
    assert ack.status, ack.feedback
    return peer


async def test_a_message_read_alone_over_tls_does_not_hold_the_next_until_its_sync(
    tmp_path: Path, certs: Certificates
) -> None:
    """Over TLS a message read alone may have more behind it. A producer writes one message,
    and the next only once the first was delivered, while the disk stalls: the broker reads
    and delivers the second while the first waits for its sync. Its reader used to store a
    message read alone itself and read on only once that was durable, so every message of a
    producer with sends in flight waited for the sync before it."""
    listener = RecordingListener()
    async with (
        running_broker(
            tmp_path, tls=certs.broker_tls(), store=f"file://{tmp_path}/store?fsync=batch"
        ) as broker,
        Consumer(
            registry_uri(tmp_path), group="sms", bindings=[PAYMENTS], listener=listener, tls=certs.ca_pem
        ),
    ):
        writer = broker.store._writer  # type: ignore[attr-defined]
        writer.stall_timeout = 60.0  # no waiter is failed while the test holds the disk
        peer = await tls_peer(broker.address, certs, "orders")
        messages = [header("orders", topic="trade", message_type="pay-succ") for _ in range(2)]
        writer._io.acquire()  # the disk stalls: no save becomes durable
        try:
            for sent, message in enumerate(messages, start=1):
                # Each written once the one before was delivered, so each is read alone.
                await peer.send(
                    peer.next_opaque(), Cmd.BYTES_MESSAGE, pb.BytesMessage(header=message, body=b"x")
                )
                await wait_until(
                    lambda: len(listener.deliveries) == sent,  # noqa: B023 (awaited in this turn of the loop)
                    timeout=5.0,
                    what=f"message {sent} delivered before the first's sync",
                )
        finally:
            writer._io.release()
        acks = [(await peer.receive(Cmd.MESSAGE_STORE_ACK))[1] for _ in messages]
        await peer.aclose()
    assert all(ack.status for ack in acks), [ack.feedback for ack in acks]
    assert {m.message_id for m in listener.deliveries} == {m.messageId for m in messages}


def mutual_tls_context(certs: Certificates, *, with_certificate: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=certs.ca_pem)
    if with_certificate:
        certs.ca.issue_cert("orders@kiteq.test").configure_cert(context)
    return context


async def test_mutual_tls_refuses_a_client_without_a_certificate(tmp_path: Path, certs: Certificates) -> None:
    registry = registry_uri(tmp_path)
    mutual = certs.broker_tls(ca=str(certs.ca_pem), require_client_cert=True)
    async with running_broker(tmp_path, tls=mutual, server={"topics": ["trade"]}) as broker:
        # TLS 1.3: the client's side of the handshake completes before the broker checks
        # the client's certificate, so the refusal arrives as the connection closing.
        bare = ClientConnection(
            broker.address, Credentials("orders", ""), tls=mutual_tls_context(certs, with_certificate=False)
        )
        with (
            structlog.testing.capture_logs() as logs,
            trio.fail_after(5),
            pytest.raises((TLSError, ConnectionClosed)),
        ):
            await bare.run()
        refusals = [e["error"] for e in logs if e["event"] == "connection.tls_failed"]
        assert refusals and "PEER_DID_NOT_RETURN_A_CERTIFICATE" in refusals[0]
        assert not broker.groups.peers("orders")
        certified = mutual_tls_context(certs, with_certificate=True)
        async with Producer(registry, group="orders", topics=["trade"], tls=certified) as producer:
            await producer.send(Message("trade", "pay-succ", "from a certified client"))
        assert broker.events.total("stored") == 1


async def test_admin_endpoint_over_https_with_httpx_and_kiteq_admin(
    tmp_path: Path, certs: Certificates
) -> None:
    async with running_broker(tmp_path, tls=certs.broker_tls()) as broker:
        url = f"https://{broker.admin_address}"
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=certs.ca_pem)) as admin:
            health = await admin.get(f"{url}/healthz")
        assert health.status_code == 200

        def kiteq_admin(*args: str) -> subprocess.CompletedProcess[str]:
            script = Path(sys.executable).with_name("kiteq-admin")
            return subprocess.run(
                [str(script), "--admin", url, *args], capture_output=True, text=True, timeout=60, cwd=ROOT
            )

        trusted = await trio.to_thread.run_sync(kiteq_admin, "--tls-ca", str(certs.ca_pem), "--json", "stats")
        untrusted = await trio.to_thread.run_sync(kiteq_admin, "stats")
    assert trusted.returncode == 0, trusted.stderr
    assert '"address"' in trusted.stdout and broker.address in trusted.stdout
    assert untrusted.returncode == 2
    assert "pass --tls-ca" in untrusted.stderr


async def test_sync_facade_over_tls(tmp_path: Path, certs: Certificates) -> None:
    registry = registry_uri(tmp_path)
    ca = str(certs.ca_pem)
    received: list[Message] = []
    delivered = threading.Event()

    def on_message(message: Message) -> bool:
        received.append(message)
        delivered.set()
        return True

    def blocking() -> str:
        with (
            sync.Consumer(registry, group="sms", bindings=[PAYMENTS], listener=on_message, tls=ca),
            sync.Producer(registry, group="orders", topics=["trade"], tls=ca) as producer,
        ):
            message_id = producer.send_string("trade", "pay-succ", "blocking over TLS")
            assert delivered.wait(10), "the sync consumer received nothing within 10 s"
        return message_id

    async with running_broker(tmp_path, tls=certs.broker_tls()):
        sent = await trio.to_thread.run_sync(blocking)
    assert [(m.message_id, m.body) for m in received] == [(sent, "blocking over TLS")]


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (
            ["--tls-cert", "missing.pem", "--tls-key", "missing.key"],
            "[tls] cert/key: cannot load missing.pem",
        ),
        (
            ["--tls-cert", "b.pem", "--tls-key", "b.key", "--tls-require-client-cert"],
            "[tls] require_client_cert",
        ),
    ],
)
def test_kiteq_server_tls_flags_reach_the_tls_section(tmp_path: Path, flags: list[str], error: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kiteq.cli.server", "--store", "memory://", "--registry",
         registry_uri(tmp_path), *flags],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 2
    assert error in result.stderr
