"""Pre-flight checks of `run` on made-up machines (pure: no NVML, no processes)."""

from __future__ import annotations

import sys

from kohya_tuner.families import get_family
from kohya_tuner.gpu import GpuInfo, GpuProcess
from kohya_tuner.run.preflight import Facts, apply, disk_need_gib, evaluate, host_ram_need_gib

SD15 = get_family("sd15")
FLUX = get_family("flux")
OK_PROBE = {"python": "3.11.7", "modules": {"torch": "2.6.0", "accelerate": "1.6.0", "xformers": None,
                                            "bitsandbytes": None}}


def card(index=0, free=11.0, procs=()):
    return GpuInfo(index=index, name="RTX 3060", total_gib=11.76, free_gib=free, used_gib=11.76 - free,
                   compute_capability=(8, 6), processes=tuple(procs))


def facts(**kw):
    base = dict(gpus=[card()], ram_available_gib=60.0, swap_free_gib=8.0, disk_free_gib=500.0,
                checkout_path="/sd", checkout_scripts=("train_network.py", "sdxl_train_network.py",
                                                       "flux_train_network.py"),
                pin_matches=True, python="/env/bin/python", python_probe=dict(OK_PROBE))
    base.update(kw)
    return Facts(**base)


def by_name(report, name):
    return [c for c in report.checks if c.name == name]


def test_all_good_has_no_failures_or_changes():
    r = evaluate({"mixed_precision": "bf16"}, SD15, facts(), predicted_gib=6.0, lora_params=10_000_000,
                 total_steps=1000)
    assert not r.failures and not r.changes
    assert by_name(r, "gpu")[0].status == "ok"


def test_no_gpu_warns_and_goes_on():
    r = evaluate({}, SD15, facts(gpus=[], nvml_reason="no NVIDIA driver"))
    gpu = by_name(r, "gpu")[0]
    assert gpu.status == "warn" and "no NVIDIA driver" in gpu.message and "going on" in gpu.message
    assert not r.failures


def test_other_processes_warn_with_names_and_sizes_and_strict_refuses():
    procs = [GpuProcess(4242, "firefox", 1.5), GpuProcess(99, "kohya-tuner", 0.2)]
    f = facts(gpus=[card(free=9.0, procs=procs)], own_pids=frozenset({99}))
    r = evaluate({}, SD15, f)
    c = by_name(r, "gpu-processes")[0]
    assert c.status == "warn" and "firefox (pid 4242, 1.5 GiB)" in c.message and "kohya-tuner" not in c.message
    assert by_name(evaluate({}, SD15, f, strict=True), "gpu-processes")[0].status == "fail"


def test_missing_gpu_index_and_low_free_memory():
    assert by_name(evaluate({}, SD15, facts(), gpu_ids=(0, 3)), "gpu")[-1].status == "fail"
    low = evaluate({}, SD15, facts(gpus=[card(free=3.0)]), predicted_gib=6.0)
    assert by_name(low, "gpu-free")[0].status == "warn"


def test_host_ram_short_warns():
    r = evaluate({"mixed_precision": "bf16"}, FLUX, facts(ram_available_gib=16.0, swap_free_gib=2.0))
    c = by_name(r, "ram")[0]
    assert c.status == "warn" and "kill" in c.message


def test_disk_short_fails():
    r = evaluate({"save_every_n_steps": 10}, FLUX, facts(disk_free_gib=0.2), lora_params=400_000_000,
                 total_steps=1000)
    assert by_name(r, "disk")[0].status == "fail"


def test_sd_scripts_missing_wrong_and_strict_pin():
    assert by_name(evaluate({}, SD15, facts(checkout_path=None)), "sd-scripts")[0].status == "fail"
    no_flux = facts(checkout_scripts=("train_network.py",))
    assert by_name(evaluate({}, FLUX, no_flux), "sd-scripts")[0].status == "fail"
    other = facts(pin_matches=False, pin_commit="0123456789abcdef", pin_differences=("added: --foo",))
    warn = by_name(evaluate({}, SD15, other), "sd-scripts")[0]
    assert warn.status == "warn" and "added: --foo" in warn.message and "0123456789" in warn.message
    assert by_name(evaluate({}, SD15, other, strict_pin=True), "sd-scripts")[0].status == "fail"


def test_trainer_python_problems_fail_with_the_install_command():
    broken = evaluate({}, SD15, facts(python_probe={"error": "/x/python does not exist"}))
    assert by_name(broken, "python")[0].status == "fail"
    no_torch = facts(python_probe={"modules": {"torch": None, "accelerate": "1.6.0"}})
    c = by_name(evaluate({}, SD15, no_torch), "python")[0]
    assert c.status == "fail" and "pip install torch" in c.hint
    # The command to copy names the interpreter as one shell word, spaces and quotes included.
    if sys.platform != "win32":
        import shlex

        odd = facts(python="/home/me/my env's/bin/python", python_probe={"modules": {"torch": None}})
        hint = by_name(evaluate({}, SD15, odd), "python")[0].hint
        words = shlex.split(hint.split("Install them: ", 1)[1].split(" (for CUDA", 1)[0])
        assert words == ["/home/me/my env's/bin/python", "-m", "pip", "install", "torch", "accelerate"]
    cpu_torch = facts(python_probe={**OK_PROBE, "cuda": False, "torch_cuda": None})
    c = by_name(evaluate({}, SD15, cpu_torch), "python")[0]
    assert c.status == "fail" and "CPU-only build" in c.message
    # With --cpu (or no GPU at all) a CPU torch is what is wanted.
    assert by_name(evaluate({}, SD15, cpu_torch, cpu=True), "python")[0].status == "ok"


def test_missing_xformers_and_bitsandbytes_switch_settings_and_say_so():
    cfg = {"xformers": True, "optimizer_type": "AdamW8bit", "mixed_precision": "bf16"}
    r = evaluate(cfg, SD15, facts())
    keys = {k: new for k, _old, new, _why in r.changes}
    assert keys["xformers"] is None and keys["sdpa"] is True
    assert keys["optimizer_type"] == "Adafactor"
    assert "relative_step=False" in keys["optimizer_args"]
    out = apply(cfg, r)
    assert "xformers" not in out and out["sdpa"] is True and out["optimizer_type"] == "Adafactor"
    assert any("bitsandbytes" in c.message for c in r.warnings)
    flux = evaluate({"xformers": True}, FLUX, facts())
    assert [(k, new) for k, _o, new, _w in flux.changes] == [("xformers", None)]
    present = facts(python_probe={"modules": {**OK_PROBE["modules"], "xformers": "0.0.29",
                                              "bitsandbytes": "0.45.0"}})
    assert not evaluate(cfg, SD15, present).changes


def test_ram_and_disk_needs_follow_the_config():
    assert host_ram_need_gib({"mixed_precision": "bf16"}, FLUX) > 30 > host_ram_need_gib({"mixed_precision": "bf16"},
                                                                                        SD15)
    few = host_ram_need_gib({"max_data_loader_n_workers": 0}, SD15)
    many = host_ram_need_gib({"max_data_loader_n_workers": 8}, SD15)
    assert many > few
    swap = host_ram_need_gib({"mixed_precision": "bf16", "blocks_to_swap": 20}, FLUX)
    assert swap > host_ram_need_gib({"mixed_precision": "bf16"}, FLUX)
    assert host_ram_need_gib({}, SD15, num_processes=2) > host_ram_need_gib({}, SD15)
    often = disk_need_gib({"save_every_n_steps": 10}, 100_000_000, 1000)
    rarely = disk_need_gib({"save_every_n_steps": 500}, 100_000_000, 1000)
    assert often > rarely


def test_pinned_commit_with_edited_files_is_named_as_such():
    edited = facts(pin_matches=False, pin_commit="48d368fa" + "0" * 32, pin_at_commit=True,
                   pin_local_changes=("library/train_util.py", "README.md"))
    c = by_name(evaluate({}, SD15, edited), "sd-scripts")[0]
    assert c.status == "warn" and "not the pinned commit" not in c.message
    assert "pinned commit with local changes to 2 files" in c.message and "train_util.py" in c.message
    # Edits that change the argument set are still differences from the pin.
    args = facts(pin_matches=False, pin_commit="x", pin_at_commit=True, pin_local_changes=("train_network.py",),
                 pin_differences=("added: --foo",))
    assert "added: --foo" in by_name(evaluate({}, SD15, args), "sd-scripts")[0].message


def test_a_pinned_commit_whose_files_git_cannot_compare_is_not_ok_and_strict_pin_refuses_it():
    unknown = facts(pin_matches=False, pin_commit="48d368fa" + "0" * 32, pin_at_commit=True,
                    pin_changes_unknown="git refuses a folder another user owns (its safe.directory check)")
    c = by_name(evaluate({}, SD15, unknown), "sd-scripts")[0]
    assert c.status == "warn" and "could not be compared" in c.message and "safe.directory" in c.message
    assert "local changes to 0 files" not in c.message
    assert by_name(evaluate({}, SD15, unknown, strict_pin=True), "sd-scripts")[0].status == "fail"


def test_cpu_switches_name_what_a_cpu_cannot_run_and_leave_the_rest():
    from kohya_tuner.run.preflight import cpu_switches

    config = {"mixed_precision": "fp16", "full_fp16": True, "fp8_base": True, "blocks_to_swap": 8,
              "fp8_scaled": False, "gradient_checkpointing": True, "optimizer_type": "AdamW",
              "cpu_offload_checkpointing": True}
    got = {key: (old, new) for key, old, new, _why in cpu_switches(config)}
    assert got == {"mixed_precision": ("fp16", "bf16"), "full_fp16": (True, None), "fp8_base": (True, None),
                   "blocks_to_swap": (8, None), "cpu_offload_checkpointing": (True, None)}
    assert cpu_switches({"mixed_precision": "bf16", "blocks_to_swap": 0}) == []
