"""Certificates for TLS tests and benchmarks, made by trustme: no openssl calls, no files to keep."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class Certificates:
    """A CA and the broker's certificate for 127.0.0.1 it signed, written as PEM files."""

    ca: trustme.CA
    ca_pem: Path
    cert: Path
    key: Path

    def broker_tls(self, **more: object) -> dict[str, object]:
        """The broker's `[tls]` section: this certificate, plus `more` keys (ca, require_client_cert)."""
        return {"cert": str(self.cert), "key": str(self.key), **more}


def make_certificates(directory: Path) -> Certificates:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    made = Certificates(ca, directory / "ca.pem", directory / "broker.pem", directory / "broker.key")
    ca.cert_pem.write_to_path(str(made.ca_pem))
    leaf.cert_chain_pems[0].write_to_path(str(made.cert))
    leaf.private_key_pem.write_to_path(str(made.key))
    return made
