"""A real OpenSSH sshd on loopback for the tests, as a pytest fixture factory.

    def test_x(sshd_factory):
        keys = generate_keypair(tmp_path / "keys")
        server = sshd_factory(keys.public_key)              # started, on a free port
        shell = SSHHostShell(server.endpoint, keys.private_key_path)

Each server has its own directory (config, host key, authorized_keys, pid file); all are
stopped at the end of the test. Expose it from tests/conftest.py with
`from tests.support.sshd import sshd_factory  # noqa: F401`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.market import SSHEndpoint
from providers.sim.sshd import SSHD_PATH, Sshd

__all__ = ["RunningSshd", "SshdFactory", "sshd_factory"]


@dataclass
class RunningSshd:
    sshd: Sshd

    @property
    def port(self) -> int:
        return self.sshd.port

    @property
    def endpoint(self) -> SSHEndpoint:
        return SSHEndpoint(host="127.0.0.1", port=self.sshd.port, user="root")

    @property
    def host_public_key(self) -> str:
        return self.sshd.host_public_key

    def stop(self) -> None:
        self.sshd.stop()

    def start(self) -> None:
        self.sshd.start()


SshdFactory = Callable[..., RunningSshd]


@pytest.fixture
def sshd_factory(tmp_path: Path) -> Iterator[SshdFactory]:
    """Start real sshd daemons on 127.0.0.1: `sshd_factory(public_key, workdir=None, env=None)`."""
    if not Path(SSHD_PATH).exists():
        pytest.skip(f"OpenSSH server not installed at {SSHD_PATH}")
    started: list[Sshd] = []

    def make(
        authorized_key: str,
        *,
        workdir: Path | None = None,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        port: int | None = None,
    ) -> RunningSshd:
        root = tmp_path / (name or f"sshd-{len(started)}")
        server = Sshd(root, authorized_key, workdir=workdir, env=env, port=port)
        started.append(server)
        server.start()
        return RunningSshd(server)

    yield make
    for server in started:
        server.stop()
