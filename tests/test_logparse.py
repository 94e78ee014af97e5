"""The streaming parser on every output form sd-scripts and the tools around it produce."""

from __future__ import annotations

import io
import logging
import math
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kohya_tuner.logparse import (
    EpochStart, Exited, Failure, Finished, LogParser, Milestone, ModelFamily, Oom, Progress, Resumed, Saved,
    TotalSteps, Wrapper, diagnose, is_oom, oom_figures, parse_text,
)
from kohya_tuner.logparse.parser import MAX_LINE


def rich_log(records, width: int = 80) -> str:
    """What sd-scripts' RichHandler writes to a pipe: real Rich, wrapped at `width` columns."""
    from rich.console import Console
    from rich.logging import RichHandler

    buf = io.StringIO()
    handler = RichHandler(console=Console(file=buf, width=width, color_system=None))
    handler.setFormatter(logging.Formatter("%(message)s", datefmt="%Y-%m-%d %H:%M:%S"))
    for level, message, where in records:
        name, lineno = where.split(":")
        handler.emit(logging.LogRecord("sd", getattr(logging, level), f"/sd/{name}", int(lineno), message, None,
                                       None))
    return buf.getvalue()


def of(events, cls):
    return [e for e in events if isinstance(e, cls)]


# ---- progress bars --------------------------------------------------------------------------------

def test_tqdm_carriage_return_updates_are_separate_progress_events():
    text = ("\rsteps:   0%|          | 0/6 [00:00<?, ?it/s]"
            "\rsteps:  17%|█▋        | 1/6 [00:01<00:09,  1.91s/it]"
            "\rsteps:  17%|█▋        | 1/6 [00:01<00:09,  1.91s/it, avr_loss=1.2]"
            "\rsteps:  33%|███▎      | 2/6 [00:00<00:00, 13595.80it/s, avr_loss=1.21]\n")
    bars = of(parse_text(text), Progress)
    assert [(b.step, b.total, b.loss) for b in bars] == [(0, 6, None), (1, 6, None), (1, 6, 1.2), (2, 6, 1.21)]
    assert bars[0].rate is None
    assert bars[1].rate == pytest.approx(1 / 1.91)
    assert bars[3].rate == pytest.approx(13595.8)


def test_only_the_optimizer_step_bar_is_progress():
    text = ("100%|██████████| 4/4 [00:00<00:00, 92691.80it/s]\n"
            "read caption: 100%|██████████| 4/4 [00:00<00:00, 24456.58it/s]\n"
            "validation steps:  50%|█████     | 1/2 [00:01<00:01, 1.0it/s, val_avg_loss=0.3]\n"
            "epoch validation steps: 100%|██████████| 2/2 [00:01<00:00, 1.0it/s]\n"
            "Epoch 1/134 - steps:   0%|          | 0/1600 [00:00<?, ?it/s]\n"
            "steps:   0%|          | 1/2100 [00:03<2:05:34,  3.59s/it, loss=0.473]\n")
    bars = of(parse_text(text), Progress)
    assert [(b.step, b.total, b.loss) for b in bars] == [(0, 1600, None), (1, 2100, 0.473)]


def test_text_glued_after_a_bar_is_parsed_too():
    text = ("steps:   0%|          | 0/1500 [00:00<?, ?it/s]epoch 1/1\n"
            "steps:  50%|█████     | 3/6 [00:05<00:05,  1.95s/it, avr_loss=1.15]Traceback (most recent call last):\n"
            '  File "/opt/sdscripts/train_network.py", line 1445, in train\n'
            "    accelerator.backward(loss)\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    events = parse_text(text)
    assert [type(e).__name__ for e in events] == ["Progress", "EpochStart", "Progress", "Wrapper", "ModelFamily", "Oom"]
    assert of(events, EpochStart)[0].epoch == 1
    assert of(events, Oom)[0].where == "training"


# ---- Rich records -------------------------------------------------------------------------------

def test_rich_records_wrapped_at_80_columns_are_joined_back():
    text = rich_log([
        ("INFO", "Saving current state to /data/runs/out-oom/cpu_lora-step00000003-state", "accelerator.py:3241"),
        ("INFO", "load StableDiffusion checkpoint: /data/runs/sd15-random.safetensors", "train_util.py:5530"),
        ("INFO", "resume training from local state: /very/long/output/folder/name/my_lora-step00001200-state",
         "train_util.py:4777"),
        ("INFO", "skipping 1200 steps / 1200ステップをスキップします", "train_network.py:1265"),
        ("INFO", "caching latents with caching strategy.", "train_util.py:1120"),
        ("INFO", "model saved.", "train_network.py:1729"),
    ])
    assert max(len(line) for line in text.splitlines()) == 80  # really wrapped
    events = [e for e in parse_text(text) if not isinstance(e, (ModelFamily, Wrapper))]
    assert [e.line for e in events] == [
        "Saving current state to /data/runs/out-oom/cpu_lora-step00000003-state",
        "load StableDiffusion checkpoint: /data/runs/sd15-random.safetensors",
        "resume training from local state: /very/long/output/folder/name/my_lora-step00001200-state",
        "skipping 1200 steps / 1200ステップをスキップします",
        "caching latents with caching strategy.",
        "model saved.",
    ]
    assert of(events, Saved)[0].path == "/data/runs/out-oom/cpu_lora-step00000003-state"
    assert of(events, Resumed)[0].path == "/very/long/output/folder/name/my_lora-step00001200-state"
    assert of(events, Resumed)[1].skipped == 1200
    assert of(events, Milestone)[-1].phase == "cache_latents"
    assert isinstance(events[-1], Finished)


@pytest.mark.parametrize("width", [80, 100, 133, 250])
def test_rich_paths_survive_any_console_width(width):
    path = "/home/someone/lora training/outputs/a_rather_long_output_name_for_a_lora-step00004000-state"
    events = parse_text(rich_log([("INFO", f"Saving current state to {path}", "accelerator.py:3241")], width))
    assert of(events, Saved)[0].path == path


def test_unpadded_wrapping_that_fills_lines_with_a_long_word_is_joined_too():
    # Wrappers other than Rich (textwrap) start a long word on the current line and do not pad.
    path = "/tmp/st/averyveryveryverylongdirectorynamethatwillbewrapped/out/mylora-step00000002-state"
    body = textwrap.wrap(f"Saving current state to {path}", 31, break_long_words=True, break_on_hyphens=False)
    lines = [f"2026-01-01 10:00:00 INFO     {body[0]:<31} accelerator.py:3241"] + [" " * 29 + b for b in body[1:]]
    events = parse_text("\n".join(lines) + "\n")
    assert of(events, Saved)[0].path == path


def test_console_log_simple_lines():
    text = ("saving checkpoint: /data/runs/out-simple/cpu_lora-step00000003.safetensors\n\n"
            "saving state at step 3\n"
            "Saving current state to /data/runs/out-simple/cpu_lora-step00000003-state\n"
            "generating sample images at step / サンプル画像生成 ステップ: 100\n"
            "model saved.\n")
    events = parse_text(text)
    assert [(type(e).__name__, getattr(e, "what", getattr(e, "phase", None))) for e in events] == [
        ("Saved", "checkpoint"), ("Milestone", "saving"), ("Saved", "state"), ("Progress", None),
        ("Milestone", "sampling"), ("Finished", None)]
    # The step sd-scripts names when it samples counts as steps done.
    assert of(events, Progress)[0].step == 100


# ---- other tools' decorations ---------------------------------------------------------------------

def test_prefixes_ansi_crlf_windows_paths_and_rank_tags():
    text = ("[2024-10-21 11:16:10] [INFO] saving checkpoint: C:\\loras\\out\\my lora.safetensors\r\n"
            "[2024-10-21 11:16:10] [INFO] 2024-10-21 11:16:10 INFO     model saved.          train_network.py:1313\r\n"
            "\x1b[32m2024-10-21 11:16:11\x1b[0m \x1b[34mINFO    \x1b[0m caching latents...  train_util.py:1170\r\n"
            "[rank1]: [2025-04-07 03:45:04] total optimization steps / 学習ステップ数: 1500\r\n"
            "2024-06-30 23:45:34,053 [ERROR] train_network.py: error: unrecognized arguments: --foo\r\n"
            "[0m[32mepoch 2/10[0m\r\n")
    events = parse_text(text)
    assert of(events, Saved)[0].path == "C:\\loras\\out\\my lora.safetensors"
    assert len(of(events, Finished)) == 1
    assert of(events, Milestone)[0].phase == "cache_latents"
    assert of(events, TotalSteps)[0].total == 1500
    assert of(events, Failure)[0].kind == "bad_argument"
    assert of(events, EpochStart)[0].epoch == 2


def test_partial_last_line_is_flushed_by_finish():
    parser = LogParser()
    assert parser.feed("steps: 100%|██████████| 6/6 [00:14<00:00,  2.49s/it, avr_loss=1.12]\nmodel sav") != []
    assert parser.feed("ed.") == []
    assert [type(e) for e in parser.finish()] == [Finished]


def test_crlf_split_between_chunks_is_one_line_break():
    parser = LogParser()
    events = parser.feed("epoch 1/2\r") + parser.feed("\nepoch 2/2\r") + parser.feed("\n") + parser.finish()
    assert [e.epoch for e in of(events, EpochStart)] == [1, 2]


def test_an_endless_line_is_cut_the_same_way_however_it_arrives():
    text = "x" * (MAX_LINE + 5000) + "\nmodel saved.\n"
    whole = parse_text(text)
    parser = LogParser()
    chunked = []
    for i in range(0, len(text), 7919):
        chunked += parser.feed(text[i:i + 7919])
    chunked += parser.finish()
    assert whole == chunked and isinstance(whole[-1], Finished)
    assert len(parser._buf) == 0


# ---- milestones and bookkeeping -------------------------------------------------------------------

def test_bilingual_lines_and_milestones():
    text = textwrap.dedent("""\
        running training / 学習開始
          num train images * repeats / 学習画像の数×繰り返し回数: 1500
          total optimization steps / 学習ステップ数: 1500
        override steps. steps for 10 epochs is / 指定エポックまでのステップ数: 3000
        caching Text Encoder outputs with caching strategy.
        FLUX: Block swap enabled. Swapping 18 blocks, double blocks: 9, single blocks: 18.
        Building Flux model dev from BFL checkpoint
        """)
    events = parse_text(text)
    assert [e.total for e in of(events, TotalSteps)] == [1500, 3000]
    assert [m.phase for m in of(events, Milestone)] == ["training", "cache_text_encoder", "model_load",
                                                        "model_load"]
    assert of(events, ModelFamily)[0].family == "flux"


def test_family_from_the_entry_script_prefers_the_specific_one():
    text = ('  File "/sd/sdxl_train_network.py", line 184, in <module>\n'
            '  File "/sd/train_network.py", line 227, in train\n')
    assert [e.family for e in of(parse_text("Traceback (most recent call last):\n" + text + "ValueError: x\n"),
                                  ModelFamily)] == ["sdxl"]


# ---- OOM, every form -----------------------------------------------------------------------------

OOM_FORMS = {
    "torch 2.2+": (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 80.00 MiB. GPU 0 has a total capacity of "
        "12.00 GiB of which 6.31 GiB is free. Including non-PyTorch memory, this process has 5.60 GiB memory in use. "
        "Of the allocated memory 4.64 GiB is allocated by PyTorch, and 14.47 MiB is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        dict(tried_gib=0.0781, capacity_gib=12.0, free_gib=6.31, process_in_use_gib=5.6, allocated_gib=4.64,
             reserved_unallocated_gib=0.0141)),
    "torch.cuda name, 2.1 typo": (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacty of "
        "23.65 GiB of which 2.94 MiB is free. Process 3920 has 20.10 GiB memory in use. Including non-PyTorch "
        "memory, this process has 3.53 GiB memory in use. Of the allocated memory 2.90 GiB is allocated by "
        "PyTorch, and 120.00 MiB is reserved by PyTorch but unallocated.",
        dict(tried_gib=1.0, capacity_gib=23.65, free_gib=0.0029, process_in_use_gib=3.53, allocated_gib=2.9,
             reserved_unallocated_gib=0.1172)),
    "legacy": (
        "RuntimeError: CUDA out of memory. Tried to allocate 58.00 MiB (GPU 0; 8.00 GiB total capacity; 6.74 GiB "
        "already allocated; 0 bytes free; 6.93 GiB reserved in total by PyTorch) If reserved memory is >> allocated "
        "memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
        "PYTORCH_CUDA_ALLOC_CONF",
        dict(tried_gib=0.0566, capacity_gib=8.0, free_gib=0.0, process_in_use_gib=None, allocated_gib=6.74,
             reserved_unallocated_gib=0.19)),
    "pytorch 1.x cached": (
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 3.95 GiB total capacity; 2.78 GiB "
        "already allocated; 5.06 MiB free; 2.84 GiB cached)",
        dict(tried_gib=0.0195, capacity_gib=3.95, free_gib=0.0049, process_in_use_gib=None, allocated_gib=2.78,
             reserved_unallocated_gib=0.06)),
    "cudaMallocAsync": (
        "torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)\n"
        "Currently allocated     : 21.21 GiB\n"
        "Requested               : 40.00 MiB\n"
        "Device limit            : 23.99 GiB\n"
        "Free (according to CUDA): 0 bytes\n"
        "PyTorch limit (set by user-supplied memory fraction)\n"
        "                        : 17179869184.00 GiB",
        dict(tried_gib=0.0391, capacity_gib=23.99, free_gib=0.0, process_in_use_gib=None, allocated_gib=21.21,
             reserved_unallocated_gib=None)),
    "CUDA error": ("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at "
                   "some other API call, so the stacktrace below might be incorrect.", {}),
    "cuBLAS": ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", {}),
    "cuDNN": ("RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED", {}),
    "cuDNN workspace": ("RuntimeError: cuDNN error: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE", {}),
    "no exception name": ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 7.75 GiB "
                          "of which 1.12 GiB is free.", dict(tried_gib=2.0, capacity_gib=7.75, free_gib=1.12)),
    "ComfyUI record": ("2025-07-08 10:39:40 ERROR    !!! Exception during processing !!! Allocation on device "
                       "                  execution.py:430", {}),
    "ROCm": ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity "
             "of 15.98 GiB of which 0 bytes is free.", dict(tried_gib=0.5, capacity_gib=15.98, free_gib=0.0)),
}


@pytest.mark.parametrize("name", sorted(OOM_FORMS))
def test_every_oom_form_is_an_oom_with_its_figures(name):
    text, figures = OOM_FORMS[name]
    events = parse_text(text + "\n")
    ooms = of(events, Oom)
    assert len(ooms) == 1 and not of(events, Failure)
    got = ooms[0].figures.schema_dict()
    for key, value in figures.items():
        if value is None:
            assert got[key] is None, key
        else:
            assert got[key] == pytest.approx(value, abs=1e-3), key
    assert is_oom(text)
    assert diagnose(events).outcome == "oom"


def test_oom_message_wrapped_over_lines_is_read_whole():
    text = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.76 GiB total capacity; "
            "10.92 GiB already allocated; 56.25 MiB free; 10.97 GiB\n"
            "reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb "
            "to avoid fragmentation.  See documentation for \nMemory Management and PYTORCH_CUDA_ALLOC_CONF\n"
            "steps:   0%|          | 1/2100 [00:03<2:05:34,  3.59s/it, loss=0.473]\n")
    events = parse_text(text)
    assert [type(e).__name__ for e in events] == ["Oom", "Progress"]
    f = events[0].figures
    assert (f.capacity_gib, f.free_gib) == (11.76, pytest.approx(0.0549, abs=1e-4))
    assert f.reserved_unallocated_gib == pytest.approx(0.05)


def test_other_processes_on_the_gpu_are_named():
    f = oom_figures(OOM_FORMS["torch.cuda name, 2.1 typo"][0])
    assert f.other_processes == ((3920, 20.1),)
    assert f.held_elsewhere_gib == pytest.approx(20.1)
    assert f.device == 0


def test_fragmentation_needs_a_large_reserved_but_unallocated_share():
    def fig(ru, tried, alloc):
        return oom_figures(f"CUDA out of memory. Tried to allocate {tried} GiB. GPU 0 has a total capacity of 24 GiB"
                           f" of which 0.1 GiB is free. Of the allocated memory {alloc} GiB is allocated by PyTorch,"
                           f" and {ru} GiB is reserved by PyTorch but unallocated.")
    assert fig(3.0, 1.0, 19.0).fragmented
    assert fig(0.6, 0.5, 20.0).fragmented        # the request would have fit into the unused part
    assert not fig(0.49, 2.0, 5.9).fragmented    # sd-scripts' injected OOM: a real shortage
    assert not fig(0.014, 0.08, 4.6).fragmented


CPU_OOM_FORMS = [
    "RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: can't allocate memory: you tried "
    "to allocate 1073741824 bytes. Error code 12 (Cannot allocate memory)",
    "RuntimeError: [enforce fail at ..\\c10\\core\\impl\\alloc_cpu.cpp:72] data. DefaultCPUAllocator: not enough "
    "memory: you tried to allocate 58982400 bytes.",
    "torch.OutOfMemoryError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 236027904 bytes. Error code 12 (Cannot allocate memory)",
    "MemoryError",
    "MemoryError: Unable to allocate 1.50 GiB for an array with shape (1024, 1024, 384) and data type float32",
    "OSError: The paging file is too small for this operation to complete. (os error 1455)",
    "Killed",
]


@pytest.mark.parametrize("text", CPU_OOM_FORMS)
def test_host_ram_exhaustion_is_never_a_cuda_oom(text):
    events = parse_text(text + "\n")
    assert not of(events, Oom)
    assert [f.kind for f in of(events, Failure)] == ["cpu_oom"]
    assert not is_oom(text)
    d = diagnose(events)
    assert (d.outcome, d.error.kind, d.oom) == ("cpu_oom", "cpu_oom", None)


LOOK_ALIKES = {
    "RuntimeError: CUDA error: no kernel image is available for execution on the device": "cuda_unavailable",
    "AssertionError: Torch not compiled with CUDA enabled": "cuda_unavailable",
    "RuntimeError: Found no NVIDIA driver on your system.": "cuda_unavailable",
    "ModuleNotFoundError: No module named 'xformers'": "xformers",
    "NotImplementedError: No operator found for `memory_efficient_attention_forward` with inputs:": "xformers",
    "RuntimeError: CUDA Setup failed despite GPU being available. Please run python -m bitsandbytes": "bitsandbytes",
    "FileNotFoundError: [Errno 2] No such file or directory: '/models/flux1-dev.safetensors'": "missing_file",
    "OSError: Can't load tokenizer for 'openai/clip-vit-large-patch14'.": "missing_file",
    "train_network.py: error: argument --network_dim: invalid int value: 'x'": "bad_argument",
    "voluptuous.error.MultipleInvalid: extra keys not allowed @ data['datasets'][0]['interpolation_type']":
        "bad_argument",
    "AssertionError: network_train_unet_only must be set when caching text encoder outputs": "bad_argument",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error":
        "distributed",
    "RuntimeError: use_libuv was requested but PyTorch was build without libuv support": "distributed",
    "RuntimeError: expected scalar type Half but found Float": "dtype",
    'RuntimeError: "LayerNormKernelImpl" not implemented for \'Half\'': "dtype",
    "RuntimeError: Expected all tensors to be on the same device, but found at least two devices": "other",
    "RuntimeError: CUDA error: an illegal memory access was encountered": "cuda_error",
    "RuntimeError: CUDA error: device-side assert triggered": "cuda_error",
    "RuntimeError: CUDA error: invalid argument": "cuda_error",
    "ValueError: some other problem": "other",
}


@pytest.mark.parametrize("text", sorted(LOOK_ALIKES))
def test_failures_get_their_own_kind_and_are_not_oom(text):
    events = parse_text(text + "\n")
    assert not of(events, Oom)
    assert [f.kind for f in of(events, Failure)] == [LOOK_ALIKES[text]]
    assert not is_oom(text)


def test_mentions_of_memory_in_ordinary_log_lines_are_not_failures():
    text = rich_log([
        ("INFO", "If you run out of memory (CUDA out of memory), set PYTORCH_CUDA_ALLOC_CONF", "train_util.py:1"),
        ("WARNING", "xformers is not installed; using sdpa", "train_util.py:2"),
    ]) + "use 8-bit AdamW optimizer | {}\nPYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
    events = parse_text(text)
    assert not of(events, Oom) and not of(events, Failure)


def test_launcher_exit_status_and_signal():
    killed = parse_text("subprocess.CalledProcessError: Command '['python', 'train_network.py']' died with "
                        "<Signals.SIGKILL: 9>.\n")
    assert [e.status for e in of(killed, Exited)] == [-9]
    failed = parse_text("E0407 03:45:08.236000 27404 api.py:869] failed (exitcode: 1) local_rank: 1 (pid: 2)\n")
    assert [e.status for e in of(failed, Exited)] == [1]
    torchrun = parse_text("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
                          "  rank      : 0 (local_rank: 0)\n  exitcode  : -9 (pid: 1234)\n"
                          "  traceback : Signal 9 (SIGKILL) received by PID 1234\n")
    assert [e.status for e in of(torchrun, Exited)] == [None, -9]
    assert not of(torchrun, Failure) and diagnose(torchrun).error.kind == "cpu_oom"


def test_nan_and_zero_loss_are_flagged_once():
    nan = "".join(f"steps:   1%|▋    | {i}/3280 [00:50<1:06:54,  1.24s/it, avr_loss=nan]\n" for i in range(40, 45))
    assert [f.kind for f in of(parse_text(nan), Failure)] == ["nan_loss"]
    zero = "".join(f"steps:   1%|▋    | {i}/3280 [00:50<1:06:54,  1.24s/it, avr_loss=0]\n" for i in range(1, 15))
    assert len(of(parse_text(zero), Failure)) == 1
    short_zero = "".join(f"steps:   1%|▋    | {i}/3280 [00:50<1:06:54,  1.24s/it, avr_loss=0]\n" for i in range(1, 5))
    assert not of(parse_text(short_zero), Failure)


@pytest.mark.parametrize("text,expected", [
    ("torch.OutOfMemoryError: CUDA out of memory.", True),
    ("RuntimeError: CUDA error: out of memory", True),
    ("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)", True),
    ("Allocation on device 0 would exceed allowed memory. (out of memory)", True),
    ("DefaultCPUAllocator: can't allocate memory", False),
    ("torch.OutOfMemoryError: DefaultCPUAllocator: not enough memory", False),
    ("MemoryError", False),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", False),
    ("", False),
])
def test_is_oom(text, expected):
    assert is_oom(text) is expected


# ---- robustness -------------------------------------------------------------------------------------

_FRAGMENTS = [
    "steps:  17%|█▋        | 1/6 [00:01<00:09,  1.91s/it, avr_loss=1.2]", "\r", "\n", "\r\n", "\x1b[31m", "\x1b[0m",
    "2026-11-30 03:06:12 INFO     Loading settings from            train_util.py:4744",
    "                    INFO     Saving current state to         accelerator.py:3241",
    " " * 29 + "/data/runs/out-oom/cpu_lora-ste", " " * 29 + "p00000003-state",
    "Traceback (most recent call last):", '  File "C:\\kohya\\train_network.py", line 1, in <module>',
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 8.00 GiB total capacity;",
    "reserved in total by PyTorch) See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
    "╭──── Traceback (most recent call last) ────╮", "│ ❱ 1145 │ return self._apply(convert) │", "╰─────╯",
    "[2024-09-18 08:19:50] [INFO] ", "[rank1]: ", "total optimization steps / 学習ステップ数: 6", "model saved.",
    "MemoryError", "Killed", "epoch 1/2", "saving checkpoint: /x.safetensors", "skipping 3 steps / 3ステップ",
    "train_network.py: error: unrecognized arguments: --x", "returned non-zero exit status 1.", "学習開始", "",
    "\ufffd", "\x00", "%|", "[", "│", "Currently allocated     : 21.21 GiB",
]
_text = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=40)), max_size=60).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_text, cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12))
def test_any_chunking_gives_the_same_events_and_never_raises(text, cuts):
    whole = parse_text(text)
    parser = LogParser()
    events = []
    last = 0
    for cut in sorted(set(c for c in cuts if c <= len(text))) + [len(text)]:
        events += parser.feed(text[last:cut])
        last = cut
    events += parser.finish()
    assert list(map(repr, events)) == list(map(repr, whole))
    diagnose(events)


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=3000))
def test_random_bytes_never_raise(data):
    events = parse_text(data.decode("utf-8", errors="replace"))
    d = diagnose(events, exit_status=None)
    assert d.outcome in ("oom", "cpu_oom", "error", "success", "incomplete")


@settings(max_examples=60, deadline=None)
@given(a=st.lists(st.sampled_from(_FRAGMENTS), max_size=30), b=st.lists(st.sampled_from(_FRAGMENTS), max_size=30),
       seed=st.randoms(use_true_random=False), status=st.one_of(st.none(), st.integers(-15, 255)))
def test_interleaved_and_truncated_logs_never_raise(a, b, seed, status):
    lines = a + b
    seed.shuffle(lines)
    text = "\n".join(lines)
    for cut in (len(text), len(text) // 2, len(text) // 3):
        d = diagnose(parse_text(text[:cut]), status)
        assert d.phase and isinstance(d.advice, list)
        if d.last_loss is not None:
            assert math.isfinite(d.last_loss)


def _sample_images():
    raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.76 GiB total capacity; 10.92 GiB "
                       "already allocated; 56.25 MiB free; 10.97 GiB reserved in total by PyTorch) If reserved "
                       "memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See "
                       "documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")


def test_a_real_rich_traceback_box_with_a_wrapped_message():
    from rich.console import Console
    from rich.traceback import Traceback

    try:
        _sample_images()
    except RuntimeError:
        buf = io.StringIO()
        Console(file=buf, width=100, color_system=None).print(Traceback())
    text = buf.getvalue()
    assert "╭" in text and "RuntimeError: CUDA out of memory" in text
    events = parse_text(text)
    assert [type(e) for e in events] == [Oom]
    assert events[0].where == "sampling"  # from the box's frames
    assert events[0].figures.reserved_unallocated_gib == pytest.approx(0.05)


def test_an_unfinished_traceback_does_not_swallow_the_training_output_after_it():
    boxed = ("│ some panel line without a traceback │\n╰──────╯\n"
             "saving checkpoint: /o/a.safetensors\nmodel saved.\n")
    events = parse_text(boxed)
    assert [type(e) for e in events] == [Saved, Finished]
    cut = ("Traceback (most recent call last):\n  File \"/sd/train_network.py\", line 1, in train\n"
           "saving checkpoint: /o/b.safetensors\n")
    events = parse_text(cut)
    # The cut traceback is held open a few lines (it may resume, see below), so its
    # Failure comes after the training output that interrupted it.
    assert [type(e) for e in events] == [Wrapper, ModelFamily, Saved, Failure]
    assert "missing" in events[3].message and events[3].kind == "truncated"


def test_traceback_interrupted_by_a_stdout_line_keeps_its_error():
    # stdout and stderr merged into one log: an epoch header lands inside the traceback.
    text = (
        "steps:  17%|█▋        | 2/12 [00:00<00:00, 159.55it/s, avr_loss=0.208]Traceback (most recent call last):\n"
        '  File "/opt/sd-scripts/train_network.py", line 6, in <module>\n'
        "\n"
        "epoch 2/6\n"
        "\n"
        '    main("train_network.py")\n'
        '  File "/opt/sd-scripts/train_network.py", line 519, in main\n'
        "    raise RuntimeError(msg)\n"
        "RuntimeError: Expected all tensors to be on the same device, but found at least two devices\n"
    )
    d = diagnose(parse_text(text), exit_status=1)
    assert d.outcome == "error" and d.error.message.startswith("RuntimeError: Expected all tensors")


def test_traceback_cut_short_by_training_output_is_still_reported():
    text = (
        "Traceback (most recent call last):\n"
        '  File "/opt/sd-scripts/train_network.py", line 6, in <module>\n'
        "epoch 2/6\n"
        "running training / 学習開始\n"
        "  num epochs / epoch数: 6\n"
        "  num batches per epoch / 1epochのバッチ数: 2\n"
        "epoch 3/6\n"
    )
    failures = [e for e in parse_text(text) if type(e).__name__ == "Failure"]
    assert len(failures) == 1 and "error line is missing" in failures[0].message
