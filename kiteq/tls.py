"""TLS for the client port: the contexts, and the handshakes at both ends.

The broker takes its certificate, key and (for mutual TLS) client CA from `[tls]`;
clients take `tls=`: an `ssl.SSLContext` of their own, or the path of the CA file that
signs the broker's certificate. Streams are `trio.SSLStream`s over TCP, so everything
above them (framing, the session) is the same with and without TLS.
"""

from __future__ import annotations

import os
import socket
import ssl

import trio

from kiteq.config import TlsConfig
from kiteq.errors import ConfigError, TLSError

TlsOption = ssl.SSLContext | str | os.PathLike[str] | None


def server_context(config: TlsConfig) -> ssl.SSLContext | None:
    """The broker's context from `[tls]`, None when TLS is off; ConfigError naming the key."""
    if not config.enabled:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.cert, config.key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"[tls] cert/key: cannot load {config.cert} with {config.key}: {exc}") from None
    if config.ca:
        try:
            context.load_verify_locations(cafile=config.ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"[tls] ca: cannot load {config.ca}: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED if config.require_client_cert else ssl.CERT_OPTIONAL
    return context


def client_context(tls: TlsOption) -> ssl.SSLContext | None:
    """A client's context: its own, one trusting the CA file at the path given, or None (plain TCP)."""
    if tls is None or isinstance(tls, ssl.SSLContext):
        return tls
    try:
        return ssl.create_default_context(cafile=os.fspath(tls))
    except (OSError, ssl.SSLError) as exc:
        raise TLSError(f"tls={os.fspath(tls)!r}: cannot load the CA file: {exc}") from None


async def open_stream(host: str, port: int, context: ssl.SSLContext | None) -> trio.abc.Stream:
    """Connect to a broker, with TLS when `context` is given; TLSError if the handshake fails.

    The caller bounds the time with a cancel scope (connect and handshake together).
    """
    tcp = await trio.open_tcp_stream(host, port)
    tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
    if context is None:
        return tcp
    stream = trio.SSLStream(tcp, context, server_hostname=host)
    try:
        await stream.do_handshake()
    except trio.BrokenResourceError as exc:
        await trio.aclose_forcefully(tcp)
        cause = exc.__cause__
        if isinstance(cause, ssl.SSLCertVerificationError):
            raise TLSError(
                f"broker {host}:{port}'s certificate is not trusted: {cause.verify_message}; "
                "pass tls= the CA that signed it"
            ) from None
        raise TLSError(f"TLS handshake with broker {host}:{port} failed: {cause or exc}") from None
    except BaseException:
        await trio.aclose_forcefully(tcp)
        raise
    return stream


async def accept_stream(tcp: trio.SocketStream, context: ssl.SSLContext | None) -> trio.abc.Stream:
    """The broker's side: the TCP stream as is, or after a TLS handshake (TLSError if it fails).

    The caller bounds the time with the handshake timeout's cancel scope.
    """
    if context is None:
        return tcp
    stream = trio.SSLStream(tcp, context, server_side=True)
    try:
        await stream.do_handshake()
    except trio.BrokenResourceError as exc:
        raise TLSError(f"TLS handshake failed: {exc.__cause__ or exc}") from None
    return stream
