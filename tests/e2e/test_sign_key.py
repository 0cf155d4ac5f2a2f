"""Issue 39, item 19: the key `pipeline sign --key` and `verify --key` read. A key mounted as
Kubernetes mounts a secret (a symlink into ..data/, itself a link to a timestamped folder) is
followed and signs; a private key others may read is refused as ssh refuses one, in one line
that says how to fix it (chmod 600), and nothing is written; a FIFO or a device named as the
key is refused at once (it would block, or never end)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.conftest import STANDARD

pytestmark = pytest.mark.slow


def _mount_like_kubernetes(key: Path, mount: Path) -> Path:
    """mount/ci.pem -> ..data/ci.pem, ..data -> ..2026_12_05_00_00_00.1/, as the kubelet
    lays out a secret volume; the files keep the key's mode."""
    stamped = mount / "..2026_12_05_00_00_00.1"
    stamped.mkdir(parents=True)
    for name in (key.name, key.name + ".pub"):
        (stamped / name).write_bytes((key.parent / name).read_bytes())
        (stamped / name).chmod((key.parent / name).stat().st_mode & 0o777)
        (mount / name).symlink_to(Path("..data") / name)
    (mount / "..data").symlink_to(stamped.name)
    return mount / key.name


def test_a_key_mounted_through_symlinks_signs_and_verifies(standard_copy, tmp_path):
    proj = standard_copy
    key = tmp_path / "keys" / "ci.pem"
    key.parent.mkdir()
    assert proj.run("keygen", str(key)).code == 0
    mounted = _mount_like_kubernetes(key, tmp_path / "secret")
    assert mounted.is_symlink() and stat.S_IMODE(mounted.stat().st_mode) == 0o600
    signed = proj.run("sign", f"engines/{STANDARD}", "--key", str(mounted))
    assert signed.code == 0, signed.err
    assert (proj.engines / STANDARD / "provenance.intoto.json").is_file()
    checked = proj.run("verify", f"engines/{STANDARD}", "--files-only", "--key", f"{mounted}.pub")
    assert checked.code == 0, checked.err


@pytest.fixture
def unsigned(project):
    """A folder `sign` reads the key for (it has a manifest); the key is read before the
    folder is verified, so a refused key is what the command stops on."""
    folder = project.engines / "standard"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text("{}")
    return project


def _refused(proj, key: str, *words: str) -> str:
    result = proj.run("sign", "engines/standard", "--key", key, timeout=120)
    assert result.code == 2, (result.code, result.err)
    assert "Traceback" not in result.err and len(result.error_lines) == 1, result.err
    for word in words:
        assert word in result.error_lines[0], (word, result.error_lines[0])
    assert not (proj.engines / "standard" / "provenance.intoto.json").exists()
    return result.error_lines[0]


@pytest.mark.parametrize(("mode", "who"), [(0o644, "every user"), (0o640, "its group"),
                                           (0o604, "every user")])
def test_a_private_key_others_may_read_is_refused_saying_chmod_600(unsigned, tmp_path, mode, who):
    key = tmp_path / "ci.pem"
    assert unsigned.run("keygen", str(key)).code == 0
    key.chmod(mode)
    line = _refused(unsigned, str(key), f"readable by {who}", f"mode {mode:04o}", f"chmod 600 {key}")
    link = tmp_path / "link.pem"  # through a symlink: the file's mode is what counts
    link.symlink_to(key)
    assert "chmod 600" in _refused(unsigned, str(link), f"readable by {who}")
    key.chmod(0o600)
    assert unsigned.run("sign", "engines/standard", "--key", str(link)).code == 5  # the key passes
    assert line.startswith("Error: ")


def test_a_fifo_or_a_device_named_as_the_key_is_refused_at_once(unsigned, tmp_path):
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)  # no writer: a blocking open would wait forever
    _refused(unsigned, str(fifo), "not a regular file")
    link = tmp_path / "link.pem"
    link.symlink_to(fifo)
    _refused(unsigned, str(link), "not a regular file")
    _refused(unsigned, "/dev/zero", "not a regular file")  # a device: a read that never ends
    _refused(unsigned, str(tmp_path), "not a regular file")  # a folder
