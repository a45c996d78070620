"""What a host sends back is bounded: command output, files, and pulled artifacts (real OpenSSH sshd)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from app.artifacts import LocalArtifactStore, PullLimits, pull_adapter, pull_checkpoints
from app.ports import DEFAULT_MAX_OUTPUT_BYTES, HostOutputTooLarge
from app.ssh import OutputTooLarge, SSHError, SSHHostShell, generate_keypair
from tests.support.sshd import SshdFactory, sshd_factory  # noqa: F401


def _shell(tmp_path: Path, sshd_factory: SshdFactory) -> tuple[SSHHostShell, Path]:  # noqa: F811
    keys = generate_keypair(tmp_path / "keys")
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    server = sshd_factory(keys.public_key, workdir=sandbox)
    return SSHHostShell(server.endpoint, keys.private_key_path, connect_timeout_s=10), sandbox


def test_command_output_past_the_cap_is_cut_off(tmp_path: Path, sshd_factory: SshdFactory) -> None:  # noqa: F811
    """A command that prints without end raises OutputTooLarge (an SSHError callers treat as a failed
    probe) well before its timeout, the default cap applies, and the shell stays usable."""
    shell, _ = _shell(tmp_path, sshd_factory)
    with shell:
        with pytest.raises(OutputTooLarge) as caught:
            shell.run("yes", timeout_s=60, max_output_bytes=100_000)
        assert isinstance(caught.value, SSHError) and isinstance(caught.value, HostOutputTooLarge)
        with pytest.raises(OutputTooLarge):
            shell.run("yes stderr-flood >&2", timeout_s=60, max_output_bytes=100_000)
        with pytest.raises(OutputTooLarge):
            shell.run(f"head -c {DEFAULT_MAX_OUTPUT_BYTES + 1} /dev/zero", timeout_s=60)
        ok = shell.run("head -c 100000 /dev/zero | tr '\\0' x", max_output_bytes=100_000)
        assert (ok.exit_code, len(ok.stdout)) == (0, 100_000)


def test_get_refuses_a_file_over_max_bytes(
    tmp_path: Path,
    sshd_factory: SshdFactory,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A file larger than max_bytes is refused before copying; one that grows past it after its size
    was read is abandoned; neither leaves a local file behind; a file within the cap arrives."""
    shell, sandbox = _shell(tmp_path, sshd_factory)
    (sandbox / "big.bin").write_bytes(b"x" * 5000)
    (sandbox / "growing.log").write_bytes(b"y" * 100)
    dest = tmp_path / "back"
    with shell:
        with pytest.raises(OutputTooLarge, match="5000 bytes"):
            shell.get("big.bin", dest / "big.bin", max_bytes=4999)
        sftp = shell._sftp_client()
        real_stat = sftp.stat

        def stat_then_grow(path: str) -> Any:
            answer = real_stat(path)
            if path == "growing.log":  # the host keeps writing once it has told us the size
                (sandbox / "growing.log").write_bytes(b"y" * 3 * 2**20)
            return answer

        monkeypatch.setattr(sftp, "stat", stat_then_grow)
        with pytest.raises(OutputTooLarge, match="growing"):
            shell.get("growing.log", dest / "growing.log", max_bytes=2**20)
        assert not dest.exists() or list(dest.iterdir()) == []
        shell.get("big.bin", dest / "big.bin", max_bytes=5000)
    assert (dest / "big.bin").read_bytes() == b"x" * 5000


def _checkpoint(root: Path, files: dict[str, bytes], *, declared: dict[str, int] | None = None) -> None:
    root.mkdir(parents=True)
    manifest = {}
    for rel, data in files.items():
        (root / rel).write_bytes(data)
        size = (declared or {}).get(rel, len(data))
        manifest[rel] = {"size": size, "sha256": hashlib.sha256(data).hexdigest()}
    (root / "COMPLETE").write_text(json.dumps({"step": 2, "files": manifest}), encoding="utf-8")


def test_pull_checks_the_manifest_before_copying(tmp_path: Path, sshd_factory: SshdFactory) -> None:  # noqa: F811
    """Checkpoints whose manifest is oversized, declares too much, or lies about a file's size are
    skipped with the reason and never stored; an honest one within the limits is pulled."""
    shell, sandbox = _shell(tmp_path, sshd_factory)
    ckpts = sandbox / "job" / "checkpoints"
    _checkpoint(ckpts / "step-00000001", {"w.bin": b"a" * 1000})
    _checkpoint(ckpts / "step-00000002", {"w.bin": b"b" * 1000, "x.bin": b"c" * 1000})  # 2000 in all
    _checkpoint(ckpts / "step-00000003", {"w.bin": b"d" * 900})
    (ckpts / "step-00000003" / "w.bin").write_bytes(b"d" * 50_000)  # grew after its manifest: a lie
    (ckpts / "step-00000004").mkdir()
    (ckpts / "step-00000004" / "COMPLETE").write_text(" " * 5000 + "{}", encoding="utf-8")
    store = LocalArtifactStore(tmp_path / "store")
    limits = PullLimits(manifest_bytes=4096, file_bytes=1500, total_bytes=1500, disk_reserve_bytes=0)
    with shell:
        report = pull_checkpoints(shell, "job", store, job="j1", staging=tmp_path / "staging", limits=limits)
    reasons = dict(report.skipped)
    assert report.pulled == ("step-00000001",)
    assert "4096" in reasons["step-00000004"]
    assert "over the 1500 allowed" in reasons["step-00000002"]
    assert "over the 900 bytes allowed" in reasons["step-00000003"]
    assert not any(k.startswith("jobs/j1/checkpoints/step-0000000" + n) for k in store.list_keys("") for n in "234")


def test_pull_refuses_what_the_free_disk_cannot_hold(tmp_path: Path, sshd_factory: SshdFactory) -> None:  # noqa: F811
    """An adapter whose declared size would leave less than the reserve free is refused before copying."""
    shell, sandbox = _shell(tmp_path, sshd_factory)
    _checkpoint(sandbox / "job" / "adapter", {"adapter.bin": b"z" * 100})
    store = LocalArtifactStore(tmp_path / "store")
    with shell, pytest.raises(Exception, match="free disk space"):
        pull_adapter(
            shell, "job", store, job="j1", staging=tmp_path / "staging", limits=PullLimits(disk_reserve_bytes=2**62)
        )
    assert store.list_keys("") == []
