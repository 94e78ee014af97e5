"""Real faulty filesystems where the machine allows them: a tiny tmpfs that fills up,
and a read-only folder (a read-only tmpfs for root, whom permissions do not stop;
a mode-0555 folder for anyone else)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def _mount(target: Path, options: str) -> bool:
    if os.name != "posix" or os.geteuid() != 0:
        return False
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True)
    return res.returncode == 0


def _umount(target: Path) -> None:
    subprocess.run(["umount", "-l", str(target)], capture_output=True)


@pytest.fixture()
def tiny_disk(tmp_path):
    """A 512 KiB filesystem; tests fill it to make writes fail with ENOSPC for real."""
    target = tmp_path / "tiny"
    target.mkdir()
    if not _mount(target, "size=512k,mode=0755"):
        pytest.skip("cannot mount a small tmpfs here (needs root); the injected-ENOSPC tests cover this")
    yield target
    _umount(target)


def fill(disk: Path, leave: int = 0) -> None:
    """Fill `disk` until fewer than `leave` bytes are free."""
    filler = disk / ".filler"
    with open(filler, "ab") as fh:
        try:
            while True:
                st = os.statvfs(disk)
                free = st.f_bavail * st.f_frsize
                if free <= leave:
                    break
                fh.write(b"\0" * max(4096, min(1 << 20, (free - leave) // 2)))
                fh.flush()
        except OSError:
            pass


@pytest.fixture()
def make_readonly(tmp_path):
    """Returns a function that turns a folder (with what is in it) read-only."""
    mounted: list[Path] = []
    chmodded: list[Path] = []

    def freeze(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        if os.name == "posix" and os.geteuid() == 0:
            # Root ignores modes; a tmpfs remounted read-only stops even root.
            saved = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
            if not _mount(folder, "size=1m,mode=0755"):
                pytest.skip("cannot mount a read-only tmpfs here")
            mounted.append(folder)
            for name, data in saved.items():
                (folder / name).write_bytes(data)
            res = subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True)
            if res.returncode != 0:
                pytest.skip("cannot remount a tmpfs read-only here")
        else:
            folder.chmod(0o555)
            chmodded.append(folder)
        return folder

    yield freeze
    for folder in chmodded:
        folder.chmod(0o755)
    for folder in mounted:
        _umount(folder)
