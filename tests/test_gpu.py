from __future__ import annotations

import sys
import types
from collections import namedtuple

import pytest

from kohya_tuner import gpu
from kohya_tuner.errors import UserError

Mem = namedtuple("Mem", "total free used")
Proc = namedtuple("Proc", "pid usedGpuMemory")
GIB = 1024**3


def fake_nvml(devices, fail=None):
    """A stand-in for the pynvml module with the calls gpu.py makes."""
    m = types.ModuleType("pynvml")

    def init():
        if fail:
            raise type(fail, (Exception,), {})("boom")

    m.nvmlInit = init
    m.nvmlDeviceGetCount = lambda: len(devices)
    m.nvmlSystemGetDriverVersion = lambda: b"560.35"
    m.nvmlDeviceGetHandleByIndex = lambda i: devices[i]
    m.nvmlDeviceGetMemoryInfo = lambda h: Mem(h["total"], h["total"] - h["used"], h["used"])
    m.nvmlDeviceGetCudaComputeCapability = lambda h: h["cc"]
    m.nvmlDeviceGetName = lambda h: h["name"]
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: h.get("procs", [])
    m.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    return m


@pytest.fixture
def nvml(monkeypatch):
    def install(devices, fail=None):
        monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(devices, fail))
        monkeypatch.setattr(gpu, "_initialised", False)
        monkeypatch.setattr(gpu, "_init_error", None)
    return install


def test_reads_cards_processes_and_bf16(nvml):
    nvml([{"name": b"NVIDIA GeForce RTX 3060", "total": 12 * GIB, "used": 3 * GIB, "cc": (8, 6),
           "procs": [Proc(999999, 2 * GIB)]},
          {"name": "NVIDIA GeForce GTX 1660 SUPER", "total": 6 * GIB, "used": 0, "cc": (7, 5)}])
    a, b = gpu.list_gpus()
    assert a.name == "NVIDIA GeForce RTX 3060" and a.total_gb_class == 12 and a.bf16
    assert a.free_gib == pytest.approx(9.0) and a.others_gib() == pytest.approx(2.0)
    assert a.processes[0].pid == 999999
    assert not b.bf16 and b.total_gb_class == 6
    choice = gpu.choose("auto")
    assert choice.gb == 12 and choice.bf16 is True and choice.others_gib == pytest.approx(2.0)
    assert gpu.choose("auto", index=1).gb == 6
    with pytest.raises(UserError, match="no GPU 2"):
        gpu.detect(2)


def test_missing_driver_is_reported_not_raised(nvml):
    nvml([], fail="NVMLError_LibraryNotFound")
    assert gpu.list_gpus() == []
    assert "driver" in gpu.nvml_status()
    with pytest.raises(UserError, match="--gpu 12"):
        gpu.choose("auto")


def test_given_size_needs_no_nvml():
    choice = gpu.choose("16")
    assert choice.gb == 16 and choice.info is None and choice.others_gib == 0.0


def test_sampler_records_peak_and_stops_without_nvml():
    values = iter([1.0, 5.0, 3.0])
    s = gpu.VramSampler(interval=0.001, reader=lambda i: next(values, None))
    s.start()
    s.join(timeout=2)
    assert [v for _, v in s.samples] == [1.0, 5.0, 3.0] and s.peak_gib == 5.0
    s.stop()


def test_several_cards_of_different_sizes_plan_for_the_smallest(nvml):
    big = {"name": "NVIDIA GeForce RTX 4090", "total": 24 * GIB, "used": 0, "cc": (8, 9)}
    small = {"name": "NVIDIA GeForce RTX 3070", "total": 8 * GIB, "used": 0, "cc": (8, 6)}
    old = {"name": "NVIDIA TITAN RTX", "total": 24 * GIB, "used": 0, "cc": (7, 5)}
    for order in ([big, small], [small, big]):
        nvml(order)
        choice, note = gpu.choose_among("auto", (0, 1))
        assert choice.gb == 8 and choice.info.name == "NVIDIA GeForce RTX 3070"
        assert "smallest" in note and "RTX 4090" in note
    # The same size, one card without bf16: the plan's precision must run on both.
    nvml([big, old])
    choice, note = gpu.choose_among("auto", (0, 1))
    assert choice.gb == 24 and choice.bf16 is False and "no bf16" in note
    # One card, or equal cards: no note; a size given by hand is taken as given.
    nvml([big, dict(big)])
    assert gpu.choose_among("auto", (0, 1))[1] is None
    assert gpu.choose_among("auto", (1,))[0].info.index == 1
    assert gpu.choose_among("12", (0, 1)) == (gpu.GpuChoice(gb=12), None)


def test_config_for_two_different_cards_plans_for_the_smaller_and_says_so(nvml, tmp_path):
    from tests.clihelp import invoke

    nvml([{"name": "NVIDIA GeForce RTX 4090", "total": 24 * GIB, "used": 0, "cc": (8, 9)},
          {"name": "NVIDIA GeForce RTX 3070", "total": 8 * GIB, "used": 0, "cc": (8, 6)}])
    res = invoke("config", "--model", "sdxl", "--job", "style", "--gpu", "auto", "--gpus", "0,1",
                 "--out", str(tmp_path / "o"), "--json")
    assert res.exit_code == 0, res.stderr
    import json

    data = json.loads(res.stdout)
    assert data["gpu"]["gb"] == 8 and data["gpu"]["name"] == "NVIDIA GeForce RTX 3070", data["gpu"]
    assert "smallest" in " ".join(res.stderr.split())
