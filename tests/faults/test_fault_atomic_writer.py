"""The one file writer: nothing the user owns is lost when a write fails, and files get
the permissions the umask asks for."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from tests.faults.conftest import fill
from kohya_tuner import fileio, planfiles, presets
from kohya_tuner.errors import UserError

BIG = "x = 1\n" * 60_000  # ~360 KB: more than the filled tiny disk has left


def _listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != ".filler"}


def test_force_on_a_full_disk_leaves_the_original_and_says_so(tiny_disk):
    target = tiny_disk / "config.toml"
    target.write_text("mine = true\n")
    fill(tiny_disk, leave=8192)
    with pytest.raises(UserError) as err:
        fileio.write_new(target, BIG, force=True)
    assert "the disk is full" in err.value.message and f"{target} is unchanged" in err.value.message
    assert _listing(tiny_disk) == {"config.toml": b"mine = true\n"}  # no .bak, no temporary file left


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_force_with_an_injected_write_error_keeps_the_original(code, tmp_path, monkeypatch):
    target = tmp_path / "config.toml"
    target.write_text("mine = true\n")

    def failing_fsync(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fileio.os, "fsync", failing_fsync)
    with pytest.raises(UserError) as err:
        fileio.write_new(target, "new = 1\n", force=True)
    assert f"{target} is unchanged" in err.value.message
    assert _listing(tmp_path) == {"config.toml": b"mine = true\n"}


def test_force_names_the_backup_and_keeps_the_old_content(tmp_path):
    target = tmp_path / "config.toml"
    target.write_text("mine = true\n")
    (tmp_path / "config.toml.bak").write_text("older\n")
    backup = fileio.write_new(target, "new = 1\n", force=True)
    assert backup == tmp_path / "config.toml.bak1"
    assert backup.read_text() == "mine = true\n" and target.read_text() == "new = 1\n"
    assert (tmp_path / "config.toml.bak").read_text() == "older\n"


def test_read_only_folder_is_refused_in_words_and_nothing_changes(tmp_path, make_readonly):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "config.toml").write_text("mine = true\n")
    make_readonly(folder)
    with pytest.raises(UserError) as err:
        fileio.write_new(folder / "config.toml", "new = 1\n", force=True)
    assert "read-only" in err.value.message and "is unchanged" in err.value.message
    with pytest.raises(UserError) as err:
        fileio.write_new(folder / "dataset.toml", "new = 1\n")
    assert "read-only" in err.value.message and "nothing was written" in err.value.message
    assert _listing(folder) == {"config.toml": b"mine = true\n"}


@pytest.mark.parametrize("umask, plain, script", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700),
                                                   (0o002, 0o664, 0o775)])
def test_plan_files_honour_the_umask_and_launch_sh_is_executable(umask, plain, script, tmp_path):
    plan = presets.compose("sd15", "character", 8)
    old = os.umask(umask)
    try:
        written = planfiles.write(planfiles.render(plan, {"datasets": []}, tmp_path), tmp_path)
    finally:
        os.umask(old)
    modes = {name: stat.S_IMODE(p.stat().st_mode) for name, p in written.items()}
    assert modes == {"config.toml": plain, "dataset.toml": plain, "launch.sh": script, "launch.bat": plain}


def test_a_failing_plan_write_puts_back_the_files_written_before_it(tmp_path, monkeypatch):
    """Every file or none, also with --force: the third write fails (injected ENOSPC),
    the two before it return to their old content and no .bak stays behind."""
    plan = presets.compose("sd15", "character", 8)
    files = planfiles.render(plan, {"datasets": []}, tmp_path)
    (tmp_path / "config.toml").write_text("users own config\n")  # replaced first, then restored
    real = fileio.atomic_write
    calls = []

    def third_fails(path, text, **kw):
        calls.append(Path(path).name)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, text, **kw)

    monkeypatch.setattr(fileio, "atomic_write", third_fails)
    with pytest.raises(UserError) as err:
        planfiles.write(files, tmp_path, force=True)
    assert "the disk is full" in err.value.message
    assert "put back: config.toml, dataset.toml" in err.value.message
    assert _listing(tmp_path) == {"config.toml": b"users own config\n"}


def test_plan_write_reports_its_backups(tmp_path):
    plan = presets.compose("sd15", "character", 8)
    (tmp_path / "launch.sh").write_text("echo mine\n")
    written = planfiles.write(planfiles.render(plan, {"datasets": []}, tmp_path), tmp_path, force=True)
    assert written.backups == {tmp_path / "launch.sh": tmp_path / "launch.sh.bak"}
    assert (tmp_path / "launch.sh.bak").read_text() == "echo mine\n"


def test_config_force_on_the_command_line_names_the_backup(tmp_path):
    from tests.clihelp import invoke

    (tmp_path / "launch.sh").write_text("echo mine\n")
    res = invoke("config", "--model", "sd15", "--job", "character", "--gpu", "8", "--out", tmp_path, "--force")
    assert res.exit_code == 0, res.output
    assert f"the old launch.sh is kept as {tmp_path / 'launch.sh.bak'}" in res.output.replace("\n", " ")


def test_config_into_a_read_only_folder_exits_2_and_changes_nothing(tmp_path, make_readonly):
    from tests.clihelp import invoke

    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "config.toml").write_text("mine = true\n")
    make_readonly(folder)
    res = invoke("config", "--model", "sd15", "--job", "character", "--gpu", "8", "--out", folder, "--force")
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "read-only" in res.output
    assert _listing(folder) == {"config.toml": b"mine = true\n"}


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="POSIX device")
def test_a_device_is_never_replaced_even_with_force():
    """Renaming a temporary file over /dev/null (root may) would break the machine."""
    with pytest.raises(UserError, match="not a regular file"):
        fileio.write_new("/dev/null", "x = 1\n", force=True)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_fit_force_names_the_backup(tmp_path):
    from tests.clihelp import invoke

    cfg = tmp_path / "in.toml"
    cfg.write_text('pretrained_model_name_or_path = "/m/sd15.safetensors"\nnetwork_module = "networks.lora"\n'
                   'network_dim = 16\nresolution = "512,512"\ntrain_batch_size = 1\nmax_train_steps = 100\n')
    out = tmp_path / "fitted.toml"
    out.write_text("mine = true\n")
    res = invoke("fit", cfg, "--model", "sd15", "--gpu", "12", "--out", out, "--force")
    assert res.exit_code in (0, 1), res.output
    assert f"The old file is kept as {tmp_path / 'fitted.toml.bak'}" in " ".join(res.output.split())
    assert (tmp_path / "fitted.toml.bak").read_text() == "mine = true\n"
    res = invoke("fit", cfg, "--model", "sd15", "--gpu", "12", "--out", out, "--force", "--json")
    assert "backups" in res.stdout
