"""SSHHostShell's second way in: a closed direct port falls back to the endpoint that answers."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from app.market import SSHEndpoint
from app.ssh import HostUnreachable, MemoryHostKeyPin, SSHHostShell, generate_keypair
from tests.support.sshd import SshdFactory, sshd_factory  # noqa: F401


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_refused_direct_port_falls_back_to_the_proxy(tmp_path: Path, sshd_factory: SshdFactory) -> None:  # noqa: F811
    """Given a direct endpoint that refuses and a fallback with a real sshd, commands run on the fallback."""
    keys = generate_keypair(tmp_path / "keys")
    server = sshd_factory(keys.public_key)
    closed = SSHEndpoint(host="127.0.0.1", port=_closed_port())
    pin = MemoryHostKeyPin()
    with SSHHostShell(closed, keys.private_key_path, pin=pin, connect_timeout_s=5, fallback=server.endpoint) as shell:
        assert shell.run("echo through-the-proxy").stdout.strip() == "through-the-proxy"
        assert shell.endpoint == server.endpoint
    assert pin.get() is not None


def test_both_endpoints_closed_is_host_unreachable_naming_both(tmp_path: Path) -> None:
    """With neither endpoint answering, HostUnreachable names the first and says the fallback failed too."""
    keys = generate_keypair(tmp_path / "keys")
    first = SSHEndpoint(host="127.0.0.1", port=_closed_port())
    second = SSHEndpoint(host="127.0.0.1", port=_closed_port())
    with pytest.raises(HostUnreachable, match="and its fallback both unreachable"):
        SSHHostShell(first, keys.private_key_path, connect_timeout_s=3, fallback=second).run("true")


def test_without_a_fallback_a_refused_port_is_unreachable_at_once(tmp_path: Path) -> None:
    """No fallback: the first refusal is the answer."""
    keys = generate_keypair(tmp_path / "keys")
    closed = SSHEndpoint(host="127.0.0.1", port=_closed_port())
    with pytest.raises(HostUnreachable) as err:
        SSHHostShell(closed, keys.private_key_path, connect_timeout_s=3).run("true")
    assert "fallback" not in str(err.value)
