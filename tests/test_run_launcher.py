from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from kohya_tuner.run import launcher
from kohya_tuner.run.launcher import LaunchSpec, LineSplitter, build_argv, build_env, run_process

PY = sys.executable


# ---- argv -------------------------------------------------------------------------------


def test_argv_single_gpu_is_explicit_and_in_order(tmp_path):
    spec = LaunchSpec(script=Path("/sd/train_network.py"), config_file=Path("/o/attempt-1.config.toml"),
                      dataset_config=Path("/o/dataset.toml"), python="/env/bin/python", mixed_precision="bf16")
    argv = build_argv(spec)
    assert argv[:3] == ["/env/bin/python", "-m", "accelerate.commands.launch"]
    assert argv[argv.index("--num_cpu_threads_per_process") + 1] == "2"
    assert argv[argv.index("--mixed_precision") + 1] == "bf16"
    assert argv[argv.index("--num_processes") + 1] == "1"
    assert "--multi_gpu" not in argv and "--cpu" not in argv
    tail = argv[argv.index("/sd/train_network.py"):]
    assert tail == ["/sd/train_network.py", "--config_file", "/o/attempt-1.config.toml",
                    "--dataset_config", "/o/dataset.toml"]


def test_argv_multi_gpu_and_accelerate_config():
    spec = LaunchSpec(script=Path("s.py"), config_file=Path("c.toml"), num_processes=2, gpu_ids=(0, 1),
                      accelerate_config=Path("/cfg/multi node.yaml"), mixed_precision="fp16")
    argv = build_argv(spec)
    i = argv.index("--multi_gpu")
    assert argv[i + 1:i + 3] == ["--num_processes", "2"]
    assert argv[argv.index("--gpu_ids") + 1] == "0,1"
    # The accelerate config file comes before the script, the script's own --config_file after it.
    assert argv.index("/cfg/multi node.yaml") < argv.index("s.py") < argv.index("c.toml")
    assert "--num_machines" not in argv  # left to the user's accelerate config


def test_argv_cpu_flag_only_when_asked():
    base = LaunchSpec(script=Path("s.py"), config_file=Path("c.toml"))
    assert "--cpu" not in build_argv(base)
    argv = build_argv(LaunchSpec(script=Path("s.py"), config_file=Path("c.toml"), cpu=True))
    assert argv.index("--cpu") < argv.index("s.py")


def test_argv_cpu_ranks_use_the_multi_process_launcher_without_cpu_flag():
    """accelerate 1.6 refuses `--cpu` next to `--multi_gpu` and launches one process for `--cpu`:
    CPU ranks go through --multi_gpu (torchrun) and ACCELERATE_USE_CPU, never --gpu_ids."""
    spec = LaunchSpec(script=Path("s.py"), config_file=Path("c.toml"), num_processes=2, gpu_ids=(0, 1), cpu=True)
    argv = build_argv(spec)
    i = argv.index("--multi_gpu")
    assert argv[i + 1:i + 3] == ["--num_processes", "2"]
    assert "--cpu" not in argv and "--gpu_ids" not in argv
    assert argv[argv.index("--num_cpu_threads_per_process") + 1] == "1"  # two ranks share the cores
    assert build_env({}, cpu=True)["ACCELERATE_USE_CPU"] == "true"
    assert "ACCELERATE_USE_CPU" not in build_env({})


def test_format_command_quotes_awkward_paths():
    argv = ["python", "/a b/ü;rm -rf x/train.py"]
    text = launcher.format_command(argv)
    if sys.platform != "win32":
        import shlex

        assert shlex.split(text) == argv


# ---- environment --------------------------------------------------------------------------


def test_env_keeps_user_values_and_adds_supervision_needs():
    user = {"PATH": "/bin", "PYTHONPATH": "/mine", "HF_HOME": "/hf", "COLUMNS": "80"}
    env = build_env(user)
    assert env["PATH"] == "/bin" and env["HF_HOME"] == "/hf"
    assert env["PYTHONPATH"] == "/mine"  # untouched without --emulate-vram
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert int(env["COLUMNS"]) >= 200
    assert user["COLUMNS"] == "80"  # the caller's mapping is not modified


def test_env_respects_users_allocator_settings():
    assert build_env({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"})["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    env = build_env({"PYTORCH_ALLOC_CONF": "expandable_segments:False"})
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env


def test_env_emulate_prepends_pythonpath_and_sets_cap():
    env = build_env({"PYTHONPATH": os.pathsep.join(["/a", "/b"])}, emulate_vram_gb=8)
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == str(launcher.emulate_dir())
    assert parts[1:] == ["/a", "/b"]
    assert env[launcher.EMULATE_ENV] == "8"
    assert (launcher.emulate_dir() / "sitecustomize.py").is_file()


def test_env_gpu_ids_pin_visible_devices_in_nvml_order():
    env = build_env({}, gpu_ids=(1,))
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "CUDA_VISIBLE_DEVICES" not in build_env({})


# ---- line splitting -----------------------------------------------------------------------


def test_splitter_carriage_returns_newlines_and_crlf_across_chunks():
    s = LineSplitter()
    out = s.feed(b"steps: 1/3\rsteps: 2/3\r")
    out += s.feed(b"\nsaving checkpoint: a\r")
    out += s.feed(b"\nlast without end")
    out += s.finish()
    assert out == ["steps: 1/3", "steps: 2/3", "saving checkpoint: a", "last without end"]


def test_splitter_keeps_utf8_cut_between_reads():
    data = "学習ステップ数: 6\n".encode("utf-8")
    s = LineSplitter()
    lines = []
    for i in range(len(data)):
        lines += s.feed(data[i:i + 1])
    assert lines == ["学習ステップ数: 6"]


# ---- processes ----------------------------------------------------------------------------


def _script(tmp_path: Path, body: str, name: str = "child.py") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body), encoding="utf-8")
    return p


def test_run_process_streams_both_pipes_and_logs_raw_bytes(tmp_path):
    weird = tmp_path / "dir with space ü; x"
    weird.mkdir()
    script = _script(weird, """
        import sys
        print("arg:" + sys.argv[1], flush=True)
        sys.stderr.write("steps: 1/2\\rsteps: 2/2\\n"); sys.stderr.flush()
        sys.exit(3)
    """)
    got = []
    log = tmp_path / "attempt-1.log"
    res = run_process([PY, str(script), "a b;c ü"], dict(os.environ), on_line=lambda s, l: got.append((s, l)),
                      log_path=log)
    assert res.exit_status == 3
    assert ("stdout", "arg:a b;c ü") in got
    assert ("stderr", "steps: 1/2") in got and ("stderr", "steps: 2/2") in got
    raw = log.read_bytes()
    assert b"steps: 1/2\rsteps: 2/2\n" in raw and "arg:a b;c ü".encode() in raw


_TREE = """
    import subprocess, sys, time
    {head}
    child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"])
    print("child", child.pid, flush=True)
    {tail}
"""


def _children_gone(pids, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX here")
def test_hang_watchdog_ends_the_whole_group(tmp_path):
    script = _script(tmp_path, _TREE.format(head="", tail="time.sleep(60)"))
    pids = []

    def on_line(stream, line):
        if line.startswith("child "):
            pids.append(int(line.split()[1]))

    t0 = time.monotonic()
    res = run_process([PY, str(script)], dict(os.environ), on_line=on_line, hang_timeout_s=1.0, grace_s=1.0)
    assert res.hung and res.stopped_by == "hang"
    assert time.monotonic() - t0 < 20
    assert pids and _children_gone(pids + [res.pid])


@pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX here")
def test_stop_event_ends_group_even_if_leader_ignores_sigint(tmp_path):
    # The leader ignores SIGINT (set before it reports, so the test cannot race it).
    script = _script(tmp_path, _TREE.format(
        head="import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)", tail="time.sleep(60)"))
    pids = []
    stop = threading.Event()

    def on_line(stream, line):
        if line.startswith("child "):
            pids.append(int(line.split()[1]))
            stop.set()

    res = run_process([PY, str(script)], dict(os.environ), on_line=on_line, stop=stop, grace_s=0.5)
    assert res.interrupted
    assert res.signals_sent[0] == "SIGINT" and "SIGTERM" in res.signals_sent
    assert _children_gone(pids + [res.pid])


def test_halt_ends_the_group_without_calling_it_an_interruption(tmp_path):
    """What the supervisor sees in the output (a NaN loss) ends the attempt like a stop, the
    whole group included, but the user did not interrupt anything."""
    script = _script(tmp_path, _TREE.format(head="", tail="time.sleep(60)"))
    pids = []
    halt = threading.Event()

    def on_line(stream, line):
        if line.startswith("child "):
            pids.append(int(line.split()[1]))
            halt.set()

    res = run_process([PY, str(script)], dict(os.environ), on_line=on_line, halt=halt, grace_s=0.5)
    assert res.stopped_by == "halt" and not res.interrupted and not res.hung
    assert res.signals_sent and res.signals_sent[0] == "SIGINT"
    assert _children_gone(pids + [res.pid])


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM handling is POSIX")
def test_sigterm_to_supervisor_stops_the_child_group(tmp_path):
    script = _script(tmp_path, _TREE.format(head="", tail="time.sleep(60)"))
    pids = []

    def on_line(stream, line):
        if line.startswith("child "):
            pids.append(int(line.split()[1]))
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()

    before = signal.getsignal(signal.SIGTERM)
    res = run_process([PY, str(script)], dict(os.environ), on_line=on_line, grace_s=1.0)
    assert res.interrupted and res.stopped_by == "interrupt"
    assert signal.getsignal(signal.SIGTERM) == before
    assert _children_gone(pids + [res.pid])


def test_missing_interpreter_is_a_user_error(tmp_path):
    from kohya_tuner.errors import UserError

    with pytest.raises(UserError):
        run_process([str(tmp_path / "no-python"), "x"], {}, on_line=lambda s, l: None)


# ---- sitecustomize for --emulate-vram --------------------------------------------------------


def _run_python(code: str, env_extra: dict, pythonpath: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_") and k != "LOCAL_RANK"}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    return subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_emulate_sitecustomize_chains_the_shadowed_one_and_skips_the_launcher(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n", encoding="utf-8")
    code = "import os, sys; print(os.environ.get('CHAINED'), 'torch' in sys.modules)"
    # The `accelerate launch` process: not a training process, torch is not even imported.
    res = _run_python(code, {launcher.EMULATE_ENV: "8"}, [str(launcher.emulate_dir()), str(other)])
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["yes", "False"]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine may have CUDA")
def test_emulate_sitecustomize_in_training_process_without_cuda_is_a_no_op(tmp_path):
    code = "import sys; print('torch' in sys.modules)"
    res = _run_python(code, {launcher.EMULATE_ENV: "8", "ACCELERATE_MIXED_PRECISION": "no"},
                      [str(launcher.emulate_dir())])
    assert res.returncode == 0, res.stderr
    # It looked (torch imported) and set nothing, since this machine has no CUDA.
    assert res.stdout.strip() == "True"
    assert "emulating" not in res.stderr
