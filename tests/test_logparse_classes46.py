"""Classes behind batches 106 to 113's misses (round 46): musubi-tuner's loggers before it became a package,
NVIDIA's imaginaire record form, argparse's usage text, a run's trackers, DeepSpeed engine or compiled model set
up, a step record in parentheses, a job seeding itself and setting its process group up, a loss computed from the
model's forward, a loop over the data loader or its bar, and prompts encoded after a sentence. Several forms of
each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import HEAD, frame, phase


@pytest.mark.parametrize("lines", [
    ["INFO:hv_train_network:Loading DiT model from /w/wan2.1_t2v_14B_fp8_e4m3fn.safetensors"],
    ["import network module: networks.lora_wan"],
    ["INFO:wan_train_network:use 8-bit AdamW optimizer | {}"],
    ["INFO:networks.lora_framepack:create LoRA network. base dim (rank): 32, alpha: 32.0"],
])
def test_musubi_tuners_module_loggers_name_it(lines):
    text = "prepare optimizer, data loader etc.\n" + "\n".join(lines) + "\nrunning training / 学習開始\n"
    assert diagnose(parse_text(text)).wrapper == "musubi-tuner"


@pytest.mark.parametrize("line", [
    "INFO:train_network:prepare optimizer, data loader etc.",
    "import network module: networks.lora",
    "INFO:networks.lora_flux:create LoRA network.",
])
def test_sd_scripts_own_loggers_do_not_name_musubi_tuner(line):
    assert diagnose(parse_text(line + "\nrunning training / 学習開始\n")).wrapper != "musubi-tuner"


@pytest.mark.parametrize("line, expected", [
    ("[06-24 17:12:25|INFO|cosmos_predict2/checkpointer.py:205:load] Loading checkpoint (local): ckpt/iter_800.pt",
     "model_load"),
    ("[06-24 17:12:28|SUCCESS|imaginaire/utils/misc.py:88:f] caching latents.", "cache_latents"),
    ("[11-02 09:01:02|WARNING|projects/train.py:40:main] generating sample images at step / x: 200", "sampling"),
])
def test_imaginaires_record_form_is_read_as_a_record(line, expected):
    assert phase(line + "\n") == expected


@pytest.mark.parametrize("line", ["[06-24 17:12:25] Loading checkpoint", "[INFO|x] nothing"])
def test_other_bracketed_heads_are_not_imaginaires(line):
    # (The first is still read by its words: the test is that no record head is invented.)
    events = parse_text(line + "\n")
    assert not any(getattr(e, "line", "").startswith("|") for e in events)


@pytest.mark.parametrize("lines", [
    ["usage: train_dreambooth.py", "       [-h]", "       --pretrained_model_name_or_path"],
    ["usage: autotrain <command> [<args>] dreambooth", "       [-h]"],
    ["usage: train_network.py [-h] [--v2] [--v_parameterization]"],
    ["usage: accelerate <command> [<args>]"],
])
def test_argparses_usage_text_is_start_up(lines):
    assert phase("\n".join(lines) + "\n") == "model_load"


@pytest.mark.parametrize("line", ["usage: 95%", "GPU usage: 12.3 GB", "Usage: see the README for details"])
def test_other_usage_words_say_no_stage(line):
    assert phase(line + "\n") == "unknown"


@pytest.mark.parametrize("source", [
    'accelerator.init_trackers("dreambooth", config=vars(args))',
    "model_engine, optimizer, _, _ = deepspeed.initialize(",
    "self.sd.unet = torch.compile(self.sd.unet, dynamic=True)",
    "torch.compile(self.sd.unet, dynamic=True)",
])
def test_trackers_engine_and_compiled_model_set_up_are_start_up(source):
    text = (HEAD + frame("/w/train.py", 640, "main", source)
            + frame("/env/lib/python3.10/site-packages/somelib/core.py", 10, "inner", "raise RuntimeError('x')")
            + "RuntimeError: x\n")
    assert phase(text) == "model_load"


@pytest.mark.parametrize("source", ["out = torch.compile_mode", "y = compiled_model(x)  # torch.compile(model) above"])
def test_other_compile_words_are_not_set_up(source):
    text = HEAD + frame("/w/train.py", 9, "main", source) + "RuntimeError: x\n"
    assert phase(text) != "model_load"


@pytest.mark.parametrize("line, step", [
    ("(step=0001005) Train Loss: 0.3442, Train Steps/Sec: 0.06, Epoch: 0.02", 1005),
    ("(step 12) loss 0.2", 12),
])
def test_a_step_record_in_parentheses_is_a_step(line, step):
    d = diagnose(parse_text(line + "\n" + HEAD + frame("/w/train.py", 236, "main", "accelerator.backward(loss)")
                            + "RuntimeError: boom\n"))
    assert d.step == step and d.phase == "training"


@pytest.mark.parametrize("lines", [
    ["[rank: 0] Global seed set to 20250912"],
    ["Seed set to 42"],
    ["Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2"],
    ["All distributed processes registered. Starting with 2 processes"],
])
def test_seeding_and_the_process_group_are_start_up(lines):
    assert phase("\n".join(lines) + "\n") == "model_load"


@pytest.mark.parametrize("line", ["The seed set to the sampler is random", "distributed training is not used"])
def test_other_seed_or_distributed_words_say_no_stage(line):
    assert phase(line + "\n") == "unknown"


@pytest.mark.parametrize("source", [
    "loss = shared.sd_model(x.unsqueeze(0), cond)[0]",
    "loss = self.model(batch)",
    "train_loss, logs = unet(noisy, t, cond)",
])
def test_a_loss_from_the_models_forward_is_the_step(source):
    text = (HEAD + frame("/w/modules/ui.py", 33, "train_hypernetwork", "hn = train_hypernetwork(*args)")
            + frame("/w/modules/hypernetwork.py", 249, "train_hypernetwork", source)
            + frame("/env/lib/python3.10/site-packages/torch/nn/modules/module.py", 1501, "_call_impl")
            + "RuntimeError: boom\n")
    assert phase(text) == "first_step"


@pytest.mark.parametrize("source", ["val_loss = self.model(batch)", "loss_fn = make_model(cfg)"])
def test_a_validation_loss_or_a_loss_function_built_is_not_the_step(source):
    text = HEAD + frame("/w/train.py", 9, "main", source) + "RuntimeError: boom\n"
    assert phase(text) != "first_step"


@pytest.mark.parametrize("source", [
    "for i, (x, text) in pbar:",
    "for step, (images, captions) in enumerate(train_dataloader):",
    "for idx, batch in enumerate(loader):",
])
def test_a_loop_over_the_data_loader_or_its_bar_is_the_step(source):
    text = (HEAD + frame("/w/textual_inversion.py", 204, "train_embedding", source)
            + frame("/env/lib/python3.10/site-packages/tqdm/std.py", 1195, "__iter__", "for obj in iterable:")
            + "RuntimeError: boom\n")
    assert phase(text) == "first_step"


@pytest.mark.parametrize("source", ["for name, module in unet.named_modules():", "for p in pbar_settings:"])
def test_other_loops_are_not_the_step(source):
    text = HEAD + frame("/w/train.py", 9, "main", source) + "RuntimeError: boom\n"
    assert phase(text) != "first_step"


@pytest.mark.parametrize("line", [
    "Prompt tensors not found. Encoding prompts..",
    "No cache found. Encoding prompts for 12 captions",
])
def test_prompts_encoded_after_a_sentence_are_text_encoder_caching(line):
    assert phase(line + "\n") == "cache_text_encoder"


@pytest.mark.parametrize("line", ["Prompt tensors not found", "see encoding prompts in the docs"])
def test_other_words_about_prompts_are_not_caching(line):
    assert phase(line + "\n") != "cache_text_encoder"
