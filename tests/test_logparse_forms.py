"""Synthetic snippets, one per form the parser must know: message wordings, whose memory a
"Process N" figure is, cut-off pastes, phases from frames, wrappers and families, the
coalescing reader, and advice that stays with the family the log shows."""

from __future__ import annotations

import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kohya_tuner.logparse import Failure, LogParser, ModelFamily, Oom, Progress, Wrapper, diagnose, is_oom, parse_text
from kohya_tuner.logparse.oomfigures import is_own_process, oom_figures
from kohya_tuner.logparse.reader import events_from_stream

TB = "Traceback (most recent call last):\n"


def frame(path: str, line: int, func: str, code: str) -> str:
    return f'  File "{path}", line {line}, in {func}\n    {code}\n'


def of(events, cls):
    return [e for e in events if isinstance(e, cls)]


# ---- message forms ------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "cuda out of memory. tried to allocate 30.00 mib",
    "RuntimeError: CUDA Out Of Memory. Tried to allocate 2.00 GiB",
    "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 224.00 MiB. GPU 0 has a total capacity of "
    "44.98 GiB of which 50.00 MiB is free.",
    "RuntimeError: MPS backend out of memory (MPS allocated: 17.80 GB, other allocations: 1.19 MB, max allowed: "
    "18.13 GB). Tried to allocate 512.00 MB on private pool.",
    "torch.AcceleratorError: CUDA error: out of memory",
    "CUDA driver error: out of memory",
])
def test_gpu_oom_wordings(text):
    assert is_oom(text)
    d = diagnose(parse_text(text + "\n"))
    assert d.outcome == "oom", text


def test_retyped_lower_case_message_keeps_its_figures():
    fig = oom_figures("cuda out of memory. tried to allocate 30.00 mib (gpu 0; 8.00 gib total capacity; "
                      "7.10 gib already allocated; 0 bytes free; 7.30 gib reserved in total by pytorch)")
    assert fig.tried_gib == pytest.approx(30 / 1024, abs=1e-4)
    assert (fig.capacity_gib, fig.allocated_gib, fig.free_gib) == (8.0, 7.1, 0.0)
    assert fig.reserved_unallocated_gib == pytest.approx(0.2)


def test_mps_figures():
    fig = oom_figures("MPS backend out of memory (MPS allocated: 17.80 GB, other allocations: 1.19 MB, max allowed: "
                      "18.13 GB). Tried to allocate 512.00 MB on private pool.")
    assert (fig.allocated_gib, fig.capacity_gib, fig.tried_gib) == (17.8, 18.13, 0.5)


@pytest.mark.parametrize("text", [
    "RuntimeError: [enforce fail at alloc_cpu.cpp:83] DefaultCPUAllocator: not enough memory: you tried to allocate "
    "471859200 bytes.",
    "OSError: The paging file is too small for this operation to complete. (os error 1455)",
    "torch.OutOfMemoryError: DefaultCPUAllocator: not enough memory: you tried to allocate 8 bytes",
])
def test_host_ram_forms_are_cpu_oom(text):
    assert not is_oom(text)
    d = diagnose(parse_text(text + "\n"))
    assert (d.outcome, d.error.kind, d.oom) == ("cpu_oom", "cpu_oom", None)


@pytest.mark.parametrize("text", [
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "RuntimeError: CUDA error: device-side assert triggered",
    "RuntimeError: CUDA error: invalid argument",
    "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
])
def test_cuda_errors_that_are_not_oom(text):
    d = diagnose(parse_text(text + "\nCUDA kernel errors might be asynchronously reported at some other API call\n"))
    assert (d.outcome, d.error.kind, d.oom) == ("error", "cuda_error", None)
    assert any("not a lack of memory" in a for a in d.advice)


# ---- whose memory -------------------------------------------------------------------------------

CONTAINER_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 14.00 MiB. GPU 0 has a total "
                 "capacity of 39.56 GiB of which 896.00 KiB is free. Process 118916 has 39.55 GiB memory in use. Of "
                 "the allocated memory 37.77 GiB is allocated by PyTorch, and 1.28 GiB is reserved by PyTorch but "
                 "unallocated. See documentation for Memory Management  (https://pytorch.org/docs)\n")


def test_a_process_line_that_matches_pytorchs_own_figures_is_the_trainer():
    d = diagnose(parse_text(CONTAINER_OOM))
    assert d.details.trainer_pid == 118916 and d.details.other_processes == ()
    assert d.oom.process_in_use_gib == 39.55
    assert not any("118916" in a or a.startswith("Free the GPU") for a in d.advice)


def test_another_process_is_still_named():
    text = CONTAINER_OOM.replace("Process 118916 has 39.55 GiB", "Process 4242 has 20.00 GiB memory in use. "
                                 "Including non-PyTorch memory, this process has 19.50 GiB")
    d = diagnose(parse_text(text))
    assert d.details.trainer_pid is None and d.details.other_processes == ((4242, 20.0),)
    assert d.advice[0].startswith("Free the GPU first") and "4242" in d.advice[0]


def test_without_this_process_a_far_bigger_process_is_another_program():
    text = CONTAINER_OOM.replace("Process 118916 has 39.55 GiB", "Process 77 has 30.00 GiB memory in use. Process "
                                 "118916 has 9.55 GiB").replace("37.77 GiB is allocated", "8.00 GiB is allocated")
    d = diagnose(parse_text(text))
    assert d.details.trainer_pid == 118916 and d.details.other_processes == ((77, 30.0),)
    assert "77" in d.advice[0]


@pytest.mark.parametrize("process,reserved,own", [
    (39.55, 39.05, True),    # 0.50 GiB CUDA context
    (79.28, 78.04, True),    # 1.24 GiB context and non-PyTorch memory
    (39.0, 39.05, True),     # figures rounded the other way
    (19.03, 4.01, False),    # someone else's
    (12.0, 10.0, False),     # 2 GiB more than PyTorch holds: not only a context
])
def test_own_process_margin(process, reserved, own):
    assert is_own_process(process, reserved) is own


# ---- cut-off pastes -----------------------------------------------------------------------------

def test_a_paste_cut_inside_a_traceback_is_truncated_with_the_phase_its_frames_show():
    text = (TB + frame("/sd/train_network.py", 400, "train", "train_dataset_group.new_cache_latents(vae, accelerator)")
            + frame("/sd/library/train_util.py", 1130, "new_cache_latents", "dataset.new_cache_latents(model, a)")
            + frame("/x/diffusers/models/autoencoder_kl.py", 260, "encode", "h = self.encoder(x)"))
    d = diagnose(parse_text(text))
    assert (d.outcome, d.error.kind, d.phase) == ("error", "truncated", "cache_latents")
    assert d.details.suspected is None and "cannot be told" in d.error.message
    assert not any("not a memory problem" in a for a in d.advice)
    assert d.advice[0].startswith("The log is cut off")


def test_likely_out_of_memory_only_when_the_wording_says_so():
    warn = "WARNING: CUDA out of memory while encoding, retrying with a smaller batch\n"
    text = warn + TB + frame("/sd/train_network.py", 1, "train", "accelerator.backward(loss)")
    d = diagnose(parse_text(text))
    assert (d.error.kind, d.details.suspected) == ("truncated", "oom")
    assert "likely out of GPU memory" in d.error.message
    assert any("wording suggests it ran out of GPU memory" in a for a in d.advice)


def test_a_headless_paste_still_gives_its_frames():
    text = (frame("/ai-toolkit/jobs/process/BaseSDTrainProcess.py", 2000, "run", "self.sd.load_model()")
            + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase, d.wrapper) == ("oom", "model_load", "ai-toolkit")


def test_an_oom_printed_before_its_own_cut_traceback_takes_its_frames():
    text = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.12 GiB\nwandb: finishing\n" + TB
            + frame("train.py", 10, "train", "trainer.fit()") + frame("sft.py", 110, "fit", "optimizer.step()"))
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("oom", "first_step")


# ---- phase from frames and progress -------------------------------------------------------------

@pytest.mark.parametrize("frames,phase", [
    ([("/sd/train_network.py", "train", "unet = accelerator.prepare(unet)"),
      ("/x/accelerate/accelerator.py", "prepare_model", "model = model.to(self.device)")], "model_load"),
    ([("/sd/train_network.py", "train", "optimizer.step()"),
      ("/x/bitsandbytes/optim/optimizer.py", "step", "self.init_state(group, p, gindex, pindex)")], "first_step"),
    ([("/sd/flux_train_network.py", "sample_images", "flux_train_utils.sample_images(...)")], "sampling"),
    ([("/sd/train_network.py", "train", "self.save_model(ckpt_name, unwrapped_nw, global_step, epoch)")],
     "saving"),
    ([("/sd/train_network.py", "train", "self.cache_text_encoder_outputs_if_needed(args, accelerator, unet)")],
     "cache_text_encoder"),
    ([("/OneTrainer/modules/trainer/GenericTrainer.py", "start", "self.model_setup.setup_train_device(m, c)")],
     "model_load"),
    ([("/x/torch/nn/modules/module.py", "to", "return self._apply(convert)")], "model_load"),
])
def test_phase_from_frames(frames, phase):
    text = TB + "".join(frame(p, 1, f, c) for p, f, c in frames) + "torch.OutOfMemoryError: CUDA out of memory.\n"
    assert diagnose(parse_text(text)).phase == phase


def test_step_zero_after_the_oom_is_the_first_step_and_later_steps_are_training():
    first = CONTAINER_OOM + "steps:   0% 0/2300 [00:01<?, ?it/s]\n"
    d = diagnose(parse_text(first))
    assert (d.phase, d.step, d.total_steps, d.details.phase_evidence) == ("first_step", 0, 2300, "progress")
    later = CONTAINER_OOM + "steps:   1%|          | 12/2300 [00:30<1:00:00,  2.00s/it, avr_loss=0.1]\n"
    assert diagnose(parse_text(later)).phase == "training"


def test_a_bar_cut_at_its_start_is_step_zero():
    d = diagnose(parse_text("RuntimeError: CUDA error: invalid argument\nSteps:   0%|"))
    assert (d.phase, d.step, d.total_steps) == ("first_step", 0, None)


def test_other_trainers_milestones():
    text = "Loading Flux2 model\nQuantizing Mistral\nError running job: CUDA error: out of memory\n"
    assert diagnose(parse_text(text)).phase == "model_load"
    text = "[INFO] Configuring text embed backend\n[INFO] Moving text encoder 1 to cuda\n[ERROR] CUDA driver error: out of memory\n"
    assert diagnose(parse_text(text)).phase == "cache_text_encoder"


# ---- wrappers and families ----------------------------------------------------------------------

@pytest.mark.parametrize("line,wrapper", [
    ('  File "/content/kohya_ss/sd-scripts/sdxl_train.py", line 1, in <module>', "kohya_ss"),
    ('  File "C:\\pinokio\\api\\fluxgym.git\\env\\lib\\x.py", line 7, in <module>', "fluxgym"),
    ('  File "/ai-toolkit/toolkit/stable_diffusion_model.py", line 1, in load_model', "ai-toolkit"),
    ('  File "/home/u/OneTrainer/modules/trainer/GenericTrainer.py", line 129, in start', "onetrainer"),
    ('  File "/w/SimpleTuner/helpers/training/trainer.py", line 1, in train', "simpletuner"),
    ('  File "/w/musubi-tuner/hv_train_network.py", line 1, in <module>', "musubi-tuner"),
    ('  File "E:\\ComfyUI\\custom_nodes\\ComfyUI-FluxTrainer\\nodes.py", line 1, in train', "comfyui"),
    ('  File "/opt/sd-scripts/train_network.py", line 1, in <module>', "sd-scripts"),
])
def test_every_wrapper_is_recognised(line, wrapper):
    events = parse_text(TB + line + "\nValueError: x\n")
    assert [e.wrapper for e in of(events, Wrapper)][-1] == wrapper
    assert diagnose(events).wrapper == wrapper


def test_a_venv_inside_a_comfyui_folder_is_not_comfyui():
    line = "/home/u/ComfyUI/.venv/lib/python3.11/site-packages/torch/cuda/__init__.py:641: UserWarning: x\n"
    assert not of(parse_text(line), Wrapper)


@pytest.mark.parametrize("line,family", [
    ("Building Flux model dev from BFL checkpoint", "flux"),
    ('  File "/sd/sdxl_train_network.py", line 1, in <module>', "sdxl"),
    ("load StableDiffusion checkpoint: /models/sd_xl_base_1.0.safetensors", "sdxl"),
    ('  File "/sd/sd3_train_network.py", line 1, in <module>', "sd3"),
    ("loading model /models/v1-5-pruned-emaonly.safetensors", "sd15"),
    ('  File "/w/musubi-tuner/wan_train_network.py", line 1, in <module>', "wan"),
])
def test_families(line, family):
    assert [e.family for e in of(parse_text(line + "\n"), ModelFamily)] == [family]


# ---- advice --------------------------------------------------------------------------------------

def _first_step_oom(prefix: str = "") -> str:
    return (prefix + "running training / 学習開始\nsteps:   0%|          | 0/100 [00:00<?, ?it/s]\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.\n")


def test_family_specific_advice_only_for_the_family_shown():
    sdxl = diagnose(parse_text(_first_step_oom('  File "/sd/sdxl_train_network.py", line 1, in <module>\n')))
    assert sdxl.family == "sdxl"
    assert not any("blocks_to_swap" in a or "t5xxl" in a or "FLUX" in a for a in sdxl.advice)
    unknown = diagnose(parse_text(_first_step_oom()))
    assert unknown.family is None
    assert not any("blocks_to_swap" in a or "t5xxl" in a or "FLUX" in a for a in unknown.advice)
    flux = diagnose(parse_text(_first_step_oom("Building Flux model dev from BFL checkpoint\n")))
    assert any("blocks_to_swap" in a for a in flux.advice)


def test_host_ram_while_saving_says_add_swap_once():
    text = ("steps:  50%|█████     | 5/10 [00:05<00:05,  1.00s/it, avr_loss=0.1]\nsaving checkpoint: /o/x.safetensors\n"
            "MemoryError\n")
    d = diagnose(parse_text(text))
    assert (d.error.kind, d.phase) == ("cpu_oom", "saving")
    assert sum("swap" in a.lower() for a in d.advice) == 1
    assert len(d.advice) == len(set(d.advice))


# ---- the coalescing reader ------------------------------------------------------------------------

_PIECES = [
    "\rsteps:  17%|█▋        | 1/6 [00:01<00:09,  1.91s/it]", "\rsteps:  33%|███▎      | 2/6 [00:02<00:09,  1.91s/it, avr_loss=1.2]",
    "\rsteps:  50%|█████     | 3/6 [00:03<00:09,  1.91s/it, avr_loss=nan]", "\rsteps:   0%|          | 0/6 [00:00<?, ?it/s]",
    "\rsteps:  67%|██████▋   | 4/6 [00:04<00:09,  1.91s/it, avr_loss=0]", "\n", "\r\n", "epoch 1/2\n",
    "[2024-09-18 08:19:50] [INFO] steps:  83%|████████▎ | 5/6 [00:05<00:01,  1.00s/it, avr_loss=0.5]\n",
    "steps:   0% 0/6 [00:00<?, ?it/s]\n", "steps: 5 steps: 9]\n", "\x1b[32msteps:  17%|█▋        | 1/6 [00:01<00:09, 1.9s/it]\x1b[0m\n",
    "saving checkpoint: /o/a.safetensors\n", "model saved.\n", "Traceback (most recent call last):\n",
    '  File "/sd/train_network.py", line 1, in train\n', "torch.OutOfMemoryError: CUDA out of memory.\n",
]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=st.lists(st.sampled_from(_PIECES), max_size=80), size=st.integers(min_value=1, max_value=200))
def test_coalescing_never_changes_the_diagnosis(pieces, size):
    text = "".join(pieces)
    plain = diagnose(parse_text(text)).to_json()
    data = text.encode("utf-8")
    parser = LogParser(coalesce_progress=True)
    coalesced = diagnose(events_from_stream(io.BytesIO(data), "utf-8", parser, chunk_size=size)).to_json()
    assert coalesced == plain


def test_coalescing_folds_a_run_of_updates_into_the_highest_and_the_last():
    text = "".join(f"\rsteps:  {i}%|█         | {i}/90 [00:10<01:00,  1.50s/it, avr_loss=0.{i:02d}]" for i in range(1, 80))
    events = list(events_from_stream(io.BytesIO((text + "\nepoch 2/2\n").encode()), "utf-8",
                                     LogParser(coalesce_progress=True)))
    bars = of(events, Progress)
    # The first update is read alone (it tells the parser which bar this is); the rest fold.
    assert [(b.step, b.loss) for b in bars] == [(1, 0.01), (79, 0.79)]
    assert not of(events, Failure) and not of(events, Oom)


def test_advice_and_diagnosis_do_not_import_each_other():
    import ast
    from pathlib import Path

    import kohya_tuner.logparse as pkg

    def imports(name):
        tree = ast.parse((Path(pkg.__file__).parent / f"{name}.py").read_text(encoding="utf-8"))
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        return found

    assert "kohya_tuner.logparse.diagnosis" not in imports("advice")
    assert "kohya_tuner.logparse.advice" in imports("diagnosis")
    assert "kohya_tuner.logparse.diagnosis" not in imports("result")


def test_nan_latents_while_caching_is_not_advised_as_a_training_loss():
    text = (TB + frame("/sd/train_network.py", 1, "train", "train_dataset_group.new_cache_latents(vae, accelerator)")
            + "RuntimeError: NaN detected in latents: /data/img/a.jpg\n")
    d = diagnose(parse_text(text))
    assert (d.phase, d.error.kind) == ("cache_latents", "nan_loss")
    assert "VAE produced NaN" in d.advice[0] and not any("loss became NaN" in a for a in d.advice)
