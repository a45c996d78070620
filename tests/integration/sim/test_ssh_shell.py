"""SSHHostShell against a real OpenSSH sshd on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.ssh import (
    CommandTimedOut,
    FileHostKeyPin,
    HostKeyChanged,
    HostUnreachable,
    SSHAuthFailed,
    SSHHostShell,
    generate_keypair,
)
from tests.support.sshd import SshdFactory, sshd_factory  # noqa: F401


def test_run_put_get_listdir_in_the_sandbox(tmp_path: Path, sshd_factory: SshdFactory) -> None:  # noqa: F811
    """Commands run in the host's working directory with its env; files move both ways by SFTP."""
    keys = generate_keypair(tmp_path / "keys")
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    server = sshd_factory(keys.public_key, workdir=sandbox, env={"GREETING": "hello there"})
    with SSHHostShell(server.endpoint, keys.private_key_path) as shell:
        r = shell.run('pwd; echo "$GREETING"; echo oops >&2; exit 3')
        assert (r.exit_code, r.stdout.split("\n")[:2], r.stderr.strip()) == (3, [str(sandbox), "hello there"], "oops")
        src = tmp_path / "job.json"
        src.write_text('{"x": 1}', encoding="utf-8")
        shell.put(src, "job/bundle/job.json")
        assert (sandbox / "job/bundle/job.json").read_text() == '{"x": 1}'
        assert shell.listdir("job/bundle") == ["job.json"]
        shell.run("echo result > job/out.txt")
        shell.get("job/out.txt", tmp_path / "back" / "out.txt")
        assert (tmp_path / "back" / "out.txt").read_text() == "result\n"
        with pytest.raises(FileNotFoundError):
            shell.get("job/missing.txt", tmp_path / "missing.txt")
        big = shell.run("head -c 300000 /dev/zero | tr '\\0' x; head -c 200000 /dev/zero | tr '\\0' y >&2")
        assert (len(big.stdout), len(big.stderr)) == (300000, 200000)


def test_sessions_get_the_hosts_own_home_not_the_renters_dotfiles(tmp_path: Path, sshd_factory: SshdFactory) -> None:  # noqa: F811
    """bash sources ~/.bashrc for every ssh command: a sim host's HOME is its own directory, so the
    renter machine's rc files (a stale pyenv rehash lock there cost 60 s per session in CI) never run."""
    keys = generate_keypair(tmp_path / "keys")
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    for server in (sshd_factory(keys.public_key), sshd_factory(keys.public_key, workdir=sandbox, env={"A": "1"})):
        home = server.sshd.home
        (home / ".bashrc").write_text("echo sourced-host-rc >&2\n", encoding="utf-8")
        with SSHHostShell(server.endpoint, keys.private_key_path) as shell:
            r = shell.run('echo "$HOME"')
        assert (r.stdout.strip(), r.stderr.strip()) == (str(home), "sourced-host-rc")
        assert home != Path.home()


def test_command_timeout_and_refused_connection(tmp_path: Path, sshd_factory: SshdFactory) -> None:  # noqa: F811
    """A command past its timeout raises CommandTimedOut; a stopped sshd raises HostUnreachable."""
    keys = generate_keypair(tmp_path / "keys")
    server = sshd_factory(keys.public_key)
    shell = SSHHostShell(server.endpoint, keys.private_key_path, connect_timeout_s=5)
    with pytest.raises(CommandTimedOut):
        shell.run("sleep 5", timeout_s=0.3)
    server.stop()
    with pytest.raises(HostUnreachable):
        shell.run("true")
    shell.close()


def test_wrong_key_is_refused(tmp_path: Path, sshd_factory: SshdFactory) -> None:  # noqa: F811
    """A key the host does not know raises SSHAuthFailed."""
    keys = generate_keypair(tmp_path / "keys")
    other = generate_keypair(tmp_path / "other")
    server = sshd_factory(keys.public_key)
    with pytest.raises(SSHAuthFailed):
        SSHHostShell(server.endpoint, other.private_key_path).run("true")


def test_host_key_is_pinned_on_first_contact_and_a_new_key_aborts(tmp_path: Path, sshd_factory: SshdFactory) -> None:  # noqa: F811
    """The first host key is recorded; another machine on the same address is refused before any command."""
    keys = generate_keypair(tmp_path / "keys")
    first = sshd_factory(keys.public_key, name="first")
    pin = FileHostKeyPin(tmp_path / "pins" / "sim-1.hostkey")
    with SSHHostShell(first.endpoint, keys.private_key_path, pin=pin) as shell:
        assert shell.run("echo hi").stdout == "hi\n"
    assert pin.get() == " ".join(first.host_public_key.split()[:2])
    with SSHHostShell(first.endpoint, keys.private_key_path, pin=FileHostKeyPin(pin.path)) as again:
        assert again.run("true").exit_code == 0  # same machine, same key: fine
    port = first.port
    first.stop()
    marker = tmp_path / "impostor-ran"
    impostor = sshd_factory(keys.public_key, name="impostor", port=port)
    assert impostor.host_public_key != first.host_public_key
    with pytest.raises(HostKeyChanged, match="another machine"):
        SSHHostShell(impostor.endpoint, keys.private_key_path, pin=FileHostKeyPin(pin.path)).run(f"touch {marker}")
    assert not marker.exists()
