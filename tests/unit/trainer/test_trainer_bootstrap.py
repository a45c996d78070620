"""`python -m trainer bootstrap`: what a host lacks of the lock is installed once, atomically, and reused."""

from __future__ import annotations

import json
import re
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from app.policy.preflight import TRAINER_STACK
from trainer.bootstrap import (
    ACTIVE_FILE,
    DEFAULT_LOCK,
    BootstrapError,
    Pin,
    bootstrap,
    main_bootstrap,
    read_lock,
    stack_key,
)
from trainer.preflight import STACK_MODULES


def make_wheel(wheelhouse: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel of one module, as pip installs it."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"])
    path = wheelhouse / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, text in files.items():
            z.writestr(p, text)
    return path


def lock_file(tmp_path: Path, *pins: str) -> Path:
    path = tmp_path / "requirements.txt"
    path.write_text("# test lock\n" + "\n".join(pins) + "\n", encoding="utf-8")
    return path


PRESENT = f"packaging=={metadata.version('packaging')}"


def test_a_complete_stack_installs_nothing_and_activates_no_directory(tmp_path: Path) -> None:
    """Given a lock this Python already satisfies, the bootstrap installs nothing and `active` is empty."""
    report = bootstrap(lock=lock_file(tmp_path, PRESENT), cache=tmp_path / "cache")
    assert (report["ok"], report["installed"], report["cached"], report["path"]) == (True, [], False, None)
    assert report["versions"] == {"packaging": metadata.version("packaging")}
    assert (tmp_path / "cache" / ACTIVE_FILE).read_text() == ""


@pytest.mark.slow
def test_missing_pins_install_from_the_wheelhouse_once_then_come_from_the_cache(tmp_path: Path) -> None:
    """A pin the host lacks is installed from the wheelhouse into stack-<key>; the second run reuses it."""
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "th_demo_pkg", "1.0")
    lock = lock_file(tmp_path, PRESENT, "th-demo-pkg==1.0")
    cache = tmp_path / "cache"
    cold = bootstrap(lock=lock, cache=cache, find_links=wheels)
    target = cache / f"stack-{stack_key(read_lock(lock))}"
    assert (cold["ok"], cold["installed"], cold["cached"], cold["path"]) == (True, ["th-demo-pkg"], False, str(target))
    assert (target / "th_demo_pkg" / "__init__.py").is_file()
    assert (cache / ACTIVE_FILE).read_text() == str(target)
    assert cold["source"] == f"wheelhouse {wheels}"
    warm = bootstrap(lock=lock, cache=cache, find_links=wheels)
    assert (warm["ok"], warm["installed"], warm["cached"]) == (True, [], True)
    assert sorted(p.name for p in cache.iterdir()) == [ACTIVE_FILE, target.name]  # no temporary left


@pytest.mark.slow
def test_a_failed_install_leaves_no_stack_directory_behind(tmp_path: Path) -> None:
    """When the wheelhouse lacks a pin, pip fails, the error says so, and no partial stack remains."""
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "th_demo_pkg", "1.0")
    cache = tmp_path / "cache"
    with pytest.raises(BootstrapError, match="pip install failed"):
        bootstrap(lock=lock_file(tmp_path, "th-demo-pkg==2.0"), cache=cache, find_links=wheels)
    assert [p.name for p in cache.iterdir()] == []


def test_the_cache_key_follows_the_pins() -> None:
    """Another version of one pin is another cache directory; the order of the lines is not."""
    a = (Pin("a", "1"), Pin("b", "2"))
    assert stack_key(a) == stack_key(a) != stack_key((Pin("a", "1"), Pin("b", "3")))


def test_a_bad_lock_or_wheelhouse_is_refused_with_exit_2_and_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wheelhouse that is not a directory or a line that is not a pin: exit 2, the JSON names the fix."""
    code = main_bootstrap(lock=lock_file(tmp_path, PRESENT), cache=tmp_path / "c", find_links=tmp_path / "none")
    out, err = capsys.readouterr()
    assert code == 2 and "Fix: pass an existing --find-links DIR" in json.loads(out)["error"]
    assert len(err.strip().splitlines()) == 1
    assert main_bootstrap(lock=lock_file(tmp_path, "transformers>=4"), cache=tmp_path / "c") == 2
    assert "is not a pin. Fix" in json.loads(capsys.readouterr().out)["error"]


def test_the_lock_pins_this_venv_and_covers_the_stack_the_preflight_reports() -> None:
    """trainer/requirements.txt pins exactly what .venv has; the reported stack is the lock's plus torch."""
    pins = read_lock(DEFAULT_LOCK)
    assert {p.name: metadata.version(p.name) for p in pins} == {p.name: p.version for p in pins}
    assert "torch" not in {p.name for p in pins}  # the image's
    assert list(STACK_MODULES.values()) == list(TRAINER_STACK)
    assert set(TRAINER_STACK) - {"torch"} <= {p.name for p in pins}


def test_the_trainer_image_installs_the_lock_on_the_torch_it_was_resolved_against() -> None:
    """trainer/Dockerfile starts from the pytorch runtime image of the lock's torch and installs the lock."""
    dockerfile = (DEFAULT_LOCK.parent / "Dockerfile").read_text(encoding="utf-8")
    torch = re.search(r"Resolved against torch==(\S+?):", DEFAULT_LOCK.read_text(encoding="utf-8"))
    assert torch is not None and torch.group(1) == metadata.version("torch").split("+")[0]
    assert re.search(rf"ARG BASE_IMAGE=pytorch/pytorch:{re.escape(torch.group(1))}-\S+-runtime", dockerfile)
    assert "pip install --no-deps --no-input -r trainer/requirements.txt" in dockerfile
    assert "python -m trainer bootstrap --check" in dockerfile
