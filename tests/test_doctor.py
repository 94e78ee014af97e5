"""doctor: each check's verdicts on made-up facts, and the probe on real interpreters."""

from __future__ import annotations

import importlib.metadata
import json
import os
import stat
import sys
import venv
from pathlib import Path

import pytest
from tests.clihelp import invoke as _invoke_cli

from kohya_tuner import doctor, gpu
from kohya_tuner.doctor.checks import DiskInfo, Facts
from kohya_tuner.doctor.probe import PythonProbe
from kohya_tuner.families import get_family
from kohya_tuner.gpu import GpuInfo, GpuProcess



def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---- facts -> checks ------------------------------------------------------------------


def _probe(**kw) -> PythonProbe:
    base = dict(python="/env/bin/python", ran=True, python_version="3.10.14", executable="/env/bin/python",
                torch="2.6.0+cu124", torch_cuda="12.4", cuda_available=True,
                devices=[{"name": "NVIDIA GeForce RTX 3060", "capability": [8, 6]}],
                arch_list=["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], accelerate="1.6.0",
                bitsandbytes="0.45.0", bitsandbytes_ran=True, packages={"accelerate": "1.6.0", "toml": "0.10.2"})
    base.update(kw)
    return PythonProbe(**base)


def _gpu(**kw) -> GpuInfo:
    base = dict(index=0, name="NVIDIA GeForce RTX 3060", total_gib=11.76, free_gib=11.2, used_gib=0.5,
                compute_capability=(8, 6), driver="550.54.14", processes=())
    base.update(kw)
    return GpuInfo(**base)


def _facts(**kw) -> Facts:
    base = dict(gpus=[_gpu()], own_pid=4242, ram_total_gib=64.0, ram_available_gib=60.0, swap_total_gib=8.0,
                disks=[DiskInfo("/work", 300.0, 1000.0)], os_name="Linux", probe=_probe(),
                requirement_pins={"accelerate": "1.6.0", "toml": "0.10.2"})
    base.update(kw)
    return Facts(**base)


def _by_name(checks, name):
    found = [c for c in checks if c.name == name]
    assert found, f"no check {name!r} in {[c.name for c in checks]}"
    return found[0]


def test_healthy_machine_passes_but_for_sd_scripts():
    checks = doctor.evaluate(_facts())
    bad = {c.name: c.status for c in checks if c.status != "pass"}
    assert bad == {"sd-scripts": "warn"}  # no checkout given in these facts
    assert doctor.exit_code(checks) == 0
    assert _by_name(checks, "GPU 0").data["bf16"] is True


def test_no_gpu_is_a_warning_not_a_failure():
    checks = doctor.evaluate(_facts(gpus=[], nvml_error="no NVIDIA driver on this machine",
                                    probe=_probe(torch="2.6.0+cpu", torch_cuda=None, cuda_available=False, devices=[],
                                                 bitsandbytes_ran=False)))
    g = _by_name(checks, "GPU")
    assert g.status == "warn" and "No NVIDIA GPU" in g.detail and "no NVIDIA driver" in g.detail
    assert _by_name(checks, "torch CUDA").status == "warn"
    assert _by_name(checks, "bitsandbytes").status == "warn"
    assert doctor.exit_code(checks) == 0


def test_hidden_gpus_are_explained():
    checks = doctor.evaluate(_facts(gpus=[], cuda_visible_devices=""))
    assert "CUDA_VISIBLE_DEVICES" in _by_name(checks, "GPU").detail


@pytest.mark.parametrize("probe_kw,status,needle", [
    ({"torch_cuda": None, "cuda_available": False}, "fail", "CPU-only"),
    ({"cuda_available": False, "notes": {"cuda": "The NVIDIA driver on your system is too old"}}, "fail", "too old"),
    ({"arch_list": ["sm_80", "sm_90"], "devices": [{"name": "RTX 5090", "capability": [12, 0]}]}, "fail", "sm_120"),
    ({"arch_list": ["sm_80", "compute_90"], "devices": [{"name": "RTX 5090", "capability": [12, 0]}]}, "pass",
     "sees 1 GPU"),
    ({"torch_hip": "6.2"}, "warn", "ROCm"),
])
def test_torch_cuda_verdicts(probe_kw, status, needle):
    check = _by_name(doctor.evaluate(_facts(probe=_probe(**probe_kw))), "torch CUDA")
    assert check.status == status and needle in check.detail


@pytest.mark.parametrize("driver,os_name,status", [
    ("550.54.14", "Linux", "pass"), ("535.104.05", "Linux", "warn"), ("515.65.01", "Linux", "fail"),
    ("551.61", "Windows", "pass"), ("546.12", "Windows", "warn"),
])
def test_driver_against_torch_cuda_build(driver, os_name, status):
    check = _by_name(doctor.evaluate(_facts(gpus=[_gpu(driver=driver)], os_name=os_name)), "torch CUDA")
    assert check.status == status, check.detail


def test_torch_missing_broken_or_old():
    missing = _by_name(doctor.evaluate(_facts(probe=_probe(torch=None, torch_cuda=None, cuda_available=False))),
                       "torch")
    assert missing.status == "warn" and "not installed" in missing.detail and "pip install" in missing.fix
    broken = doctor.evaluate(_facts(probe=_probe(torch=None, errors={"torch": "OSError: libcudnn.so.9: cannot open"})))
    assert _by_name(broken, "torch").status == "fail" and "libcudnn" in _by_name(broken, "torch").detail
    assert doctor.exit_code(broken) == 1
    old = _by_name(doctor.evaluate(_facts(probe=_probe(torch="2.4.1+cu121", torch_cuda="12.1"))), "torch")
    assert old.status == "warn" and "2.6.0" in old.detail


def test_trainer_python_versions_and_failure():
    assert _by_name(doctor.evaluate(_facts(probe=_probe(python_version="3.9.18"))), "Trainer Python").status == "fail"
    assert _by_name(doctor.evaluate(_facts(probe=_probe(python_version="3.13.1"))), "Trainer Python").status == "warn"
    assert _by_name(doctor.evaluate(_facts(probe=_probe(python_version="3.12.4"))), "Trainer Python").status == "pass"
    dead = doctor.evaluate(_facts(probe=PythonProbe(python="/x/python", error="/x/python did not answer within 60 s")))
    c = _by_name(dead, "Trainer Python")
    assert c.status == "fail" and "did not answer" in c.detail
    assert _by_name(dead, "sd-scripts requirements").status == "warn"


def test_gpu_memory_holders():
    procs = (GpuProcess(4242, "python", 3.0), GpuProcess(77, "python3", 2.5), GpuProcess(12, "Xorg", 0.1))
    c = _by_name(doctor.evaluate(_facts(gpus=[_gpu(processes=procs)])), "GPU memory users")
    assert c.status == "warn" and "pid 77" in c.detail and "4242" not in c.detail  # doctor itself is left out
    assert "kill 77" in c.fix
    calm = _by_name(doctor.evaluate(_facts(gpus=[_gpu(processes=(GpuProcess(12, "Xorg", 0.1),))])),
                    "GPU memory users")
    assert calm.status == "pass"
    unseen = _by_name(doctor.evaluate(_facts(gpus=[_gpu(used_gib=6.0)])), "GPU memory users")
    assert unseen.status == "warn" and "not visible" in unseen.detail


def test_small_or_old_gpus():
    small = _by_name(doctor.evaluate(_facts(gpus=[_gpu(total_gib=3.9)])), "GPU 0")
    assert small.status == "warn"
    ancient = _by_name(doctor.evaluate(_facts(gpus=[_gpu(compute_capability=(3, 5))])), "GPU 0")
    assert ancient.status == "fail"
    pascal = _by_name(doctor.evaluate(_facts(gpus=[_gpu(compute_capability=(6, 1))])), "GPU 0")
    assert pascal.status == "pass" and "bf16 no" in pascal.detail


@pytest.mark.parametrize("model,ram,swap,status", [
    ("flux", 16, 0, "fail"), ("flux", 32, 16, "warn"), ("flux", 64, 0, "pass"), ("sdxl", 16, 0, "pass"),
    (None, 64, 0, "pass"), (None, 16, 0, "warn"), (None, 4, 0, "fail"),
])
def test_host_ram(model, ram, swap, status):
    fam = get_family(model) if model else None
    c = _by_name(doctor.evaluate(_facts(model=fam, ram_total_gib=ram, ram_available_gib=ram * 0.9,
                                        swap_total_gib=swap)), "Host RAM")
    assert c.status == status, c.detail


def test_ram_needs_follow_model_size():
    needs = [doctor.ram_need_gib(get_family(n)) for n in ("sd15", "sdxl", "flux")]
    assert needs == sorted(needs) and 30 < needs[2] < 40


@pytest.mark.parametrize("free,status", [(2.0, "fail"), (20.0, "warn"), (100.0, "pass")])
def test_free_disk(free, status):
    c = _by_name(doctor.evaluate(_facts(disks=[DiskInfo("/data", free, 500.0)])), "Free disk")
    assert c.status == status


@pytest.mark.parametrize("cfg,status", [
    (None, "pass"), ({"distributed_type": "NO", "mixed_precision": "fp16"}, "pass"), ({"use_cpu": True}, "fail"),
    ({"distributed_type": "DEEPSPEED"}, "warn"), ({"gpu_ids": "1"}, "warn"),
])
def test_accelerate_default_config(cfg, status):
    probe = _probe(accelerate_config=cfg, accelerate_config_path="/home/u/.cache/huggingface/accelerate/default.yaml")
    assert _by_name(doctor.evaluate(_facts(probe=probe)), "accelerate").status == status


def test_accelerate_missing():
    c = _by_name(doctor.evaluate(_facts(probe=_probe(accelerate=None))), "accelerate")
    assert c.status == "warn" and "not installed" in c.detail


@pytest.mark.parametrize("kw,status,needle", [
    ({}, "pass", "not installed"),
    ({"xformers": "0.0.28", "xformers_cpp": True, "xformers_ran": True}, "pass", "ran on the GPU"),
    ({"xformers": "0.0.28", "xformers_cpp": True, "xformers_built_for": {"torch": "2.5.1+cu124"}}, "warn",
     "built for torch 2.5.1"),
    ({"xformers": "0.0.28", "xformers_cpp": False}, "warn", "do not load"),
])
def test_xformers(kw, status, needle):
    c = _by_name(doctor.evaluate(_facts(probe=_probe(**kw))), "xformers")
    assert c.status == status and needle in c.detail


def test_bitsandbytes():
    broken = _probe(bitsandbytes=None, bitsandbytes_ran=False,
                    errors={"bitsandbytes": "RuntimeError: CUDA Setup failed"})
    assert _by_name(doctor.evaluate(_facts(probe=broken)), "bitsandbytes").status == "fail"
    missing = _probe(bitsandbytes=None, bitsandbytes_ran=False)
    assert _by_name(doctor.evaluate(_facts(probe=missing)), "bitsandbytes").status == "warn"


class _Pin:
    def __init__(self, **kw):
        self.__dict__.update(dict(path="/sd", matches=False, commit="a" * 40, pinned_commit="b" * 40,
                                  missing_scripts=[], differences=[], local_changes=[], changes_unknown=""), **kw)

    def to_dict(self):
        return dict(self.__dict__)


def test_sd_scripts_verdicts():
    checkout = type("C", (), {"path": "/sd"})()
    ok = doctor.evaluate(_facts(sd_scripts=checkout, pin_report=_Pin(matches=True, commit="b" * 40)))
    assert _by_name(ok, "sd-scripts").status == "pass"
    other = _by_name(doctor.evaluate(_facts(sd_scripts=checkout, pin_report=_Pin(differences=["added: --x"]))),
                     "sd-scripts")
    assert other.status == "warn" and "1 argument difference" in other.detail
    gone = doctor.evaluate(_facts(sd_scripts=checkout, pin_report=_Pin(missing_scripts=["flux_train_network.py"])))
    assert _by_name(gone, "sd-scripts").status == "fail"
    env_bad = doctor.evaluate(_facts(sd_scripts_error="The sd-scripts folder '/x' (from $KOHYA_SD_SCRIPTS) does not "
                                                       "exist."))
    assert _by_name(env_bad, "sd-scripts").status == "fail"


def test_requirement_pins():
    pins = {"accelerate": "1.6.0", "toml": "0.10.2", "numpy": ""}
    ok = _probe(packages={"accelerate": "1.6.0", "toml": "0.10.2", "numpy": "1.26.4"})
    c = _by_name(doctor.evaluate(_facts(requirement_pins=pins, probe=ok)), "sd-scripts requirements")
    assert c.status == "pass"
    off = _probe(packages={"accelerate": "1.10.0", "toml": "0.10.2", "numpy": "2.1.0"})
    c = _by_name(doctor.evaluate(_facts(requirement_pins=pins, probe=off)), "sd-scripts requirements")
    assert c.status == "warn" and "accelerate 1.10.0 (pinned 1.6.0)" in c.detail and "numpy" not in c.detail
    gone = _probe(packages={"accelerate": "1.6.0", "toml": None, "numpy": None})
    c = _by_name(doctor.evaluate(_facts(requirement_pins=pins, probe=gone)), "sd-scripts requirements")
    assert c.status == "warn" and c.data["missing"] == ["numpy", "toml"]


@pytest.mark.parametrize("env,status", [
    ({}, "pass"), ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "pass"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}, "warn"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segment:True"}, "warn"),
    ({"PYTORCH_ALLOC_CONF": "expandable_segments"}, "fail"),
])
def test_alloc_conf(env, status):
    assert _by_name(doctor.evaluate(_facts(alloc_conf=env)), "PYTORCH_CUDA_ALLOC_CONF").status == status


# ---- the probe, on real interpreters --------------------------------------------------------


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """An interpreter with nothing installed: a fresh venv without pip."""
    where = tmp_path_factory.mktemp("bare") / "venv"
    venv.create(where, with_pip=False, system_site_packages=False, symlinks=os.name != "nt")
    exe = where / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    assert exe.exists()
    return str(exe)


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_probe_of_this_interpreter():
    p = doctor.probe_python(packages=["toml"])
    assert p.ran and p.error is None
    assert p.torch == _installed("torch")
    assert p.accelerate == _installed("accelerate")
    assert p.python_version == "%d.%d.%d" % sys.version_info[:3]
    assert p.cuda_available is False or gpu.list_gpus()
    assert p.packages["toml"] == importlib.metadata.version("toml")


def test_probe_without_torch(bare_python):
    p = doctor.probe_python(bare_python, packages=["toml"])
    assert p.ran and p.torch is None and p.accelerate is None and p.bitsandbytes is None and p.xformers is None
    assert p.errors == {} and p.packages["toml"] is None


@pytest.mark.skipif(os.name == "nt", reason="uses a POSIX shell wrapper")
def test_probe_survives_a_broken_torch(tmp_path):
    fake = tmp_path / "site"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise OSError('libcudart.so.12: cannot open shared object file')\n")
    (fake / "xformers").mkdir()
    (fake / "xformers" / "__init__.py").write_text("__version__ = '0.0.99'\n_has_cpp_library = False\n")
    (fake / "xformers" / "ops.py").write_text("")
    (fake / "bitsandbytes").mkdir()
    (fake / "bitsandbytes" / "__init__.py").write_text("raise RuntimeError('CUDA Setup failed despite GPU')\n")
    wrapper = _script(tmp_path / "python", f'PYTHONPATH="{fake}" exec "{sys.executable}" "$@"')
    p = doctor.probe_python(wrapper)
    assert p.ran and "libcudart" in p.errors["torch"] and p.torch is None
    assert p.xformers == "0.0.99" and p.xformers_cpp is False
    assert "CUDA Setup failed" in p.errors["bitsandbytes"]
    checks = doctor.evaluate(_facts(probe=p, gpus=[]))
    assert _by_name(checks, "torch").status == "fail" and _by_name(checks, "xformers").status == "warn"


@pytest.mark.skipif(os.name == "nt", reason="uses a POSIX shell wrapper")
def test_probe_of_hanging_crashing_and_missing_interpreters(tmp_path):
    hang = doctor.probe_python(_script(tmp_path / "hang", "sleep 30"), timeout=1)
    assert not hang.ran and "did not answer within 1 s" in hang.error
    crash = doctor.probe_python(_script(tmp_path / "crash", "echo 'Segmentation fault' >&2; exit 139"))
    assert not crash.ran and "Segmentation fault" in crash.error
    missing = doctor.probe_python(str(tmp_path / "nope"))
    assert not missing.ran and "does not exist" in missing.error


# ---- the command ----------------------------------------------------------------------------


def test_doctor_json_on_this_machine():
    res = _invoke_cli(*["doctor", "--json"])
    data = json.loads(res.stdout)
    names = {c["name"]: c for c in data["checks"]}
    assert data["exit_code"] == res.exit_code
    if not gpu.list_gpus():
        assert res.exit_code == 0, [c for c in data["checks"] if c["status"] == "fail"]
        assert names["GPU"]["status"] == "warn" and "No NVIDIA GPU" in names["GPU"]["detail"]
    for name in ("Host RAM", "Free disk", "Trainer Python", "torch", "accelerate", "xformers", "bitsandbytes",
                 "sd-scripts", "sd-scripts requirements", "PYTORCH_CUDA_ALLOC_CONF"):
        assert name in names, name
    assert data["python"]["torch"] == _installed("torch")


def test_doctor_with_a_python_without_torch(bare_python):
    res = _invoke_cli(*["doctor", "--python", bare_python, "--json"])
    data = json.loads(res.stdout)
    torch_check = next(c for c in data["checks"] if c["name"] == "torch")
    assert torch_check["status"] == "warn" and "torch is not installed" in torch_check["detail"]
    assert res.exit_code == data["exit_code"]
    text = _invoke_cli(*["doctor", "--python", bare_python])
    assert "torch is not installed" in text.output


def test_doctor_bad_input(tmp_path):
    res = _invoke_cli(*["doctor", "--python", str(tmp_path / "missing-python")])
    assert res.exit_code == 2 and "does not exist" in res.output and "Traceback" not in res.output
    res = _invoke_cli(*["doctor", "--sd-scripts", str(tmp_path / "nowhere")])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = _invoke_cli(*["doctor", "--model", "sd9"])
    assert res.exit_code == 2 and "Unknown model family" in res.output


def test_doctor_finds_a_checkout_from_the_environment(tmp_path, monkeypatch):
    (tmp_path / "sd").mkdir()
    monkeypatch.setenv("KOHYA_SD_SCRIPTS", str(tmp_path / "sd"))  # exists, but holds no entry scripts
    res = _invoke_cli(*["doctor", "--json"])
    data = json.loads(res.stdout)
    sd = next(c for c in data["checks"] if c["name"] == "sd-scripts")
    assert sd["status"] == "fail" and res.exit_code == 1
