"""Classes behind batches 90 to 97's first-read misses: the loop reporting a step (its step logs, its bar's
figures, a progress line with the learning rate); the gradients read after a backward pass; an embedding or a
hypernetwork saved; a video logged like a sample; a caching script named for what it caches; bitsandbytes
imported (with a paste's eaten underscores); a configuration read with json or yaml; the Hub refusing a model;
torch elastic's launcher note; a container pulled and started for the job; a training script run after a bare
prompt sign; a model manager naming its weight files; TensorFlow's C++ log prefix; a training announcement that
names its step count, which the loop's nameless bar then shows. Several forms of each, and text that must not be
read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.cleaning import clean
from tests.logparse_texts import HEAD, box_row, frame, phase

SCRIPT = "/content/sd-scripts/train_network.py"
ERR = "AttributeError: 'NoneType' object has no attribute 'item'\n"


def _in_train(source: str, path: str = SCRIPT) -> str:
    return HEAD + frame(path, 760, "<module>", "train(args)") + frame(path, 640, "train", source) + ERR


@pytest.mark.parametrize("source", [
    "logs = generate_step_logs(args, current_loss, avr_loss, lr_scheduler)",
    "progress_bar.set_postfix(**logs)",
    "accelerator.log(logs, step=global_step)",
    'f"epoch_eta:{eta_epoch}, time_all:{t:.3f}, time_data:{t_d:.3f}, lr:{lr:.3e}, "',
    "log_str = f'step {i} lr={lr:.2e} loss={loss:.4f}'",
])
def test_the_loop_reporting_its_step_is_the_step(source):
    assert phase(_in_train(source)) in ("first_step", "training")


def test_the_loop_reporting_its_step_in_a_rich_box():
    text = (box_row("/content/sd-scripts/train_network.py:640 in train") + box_row("")
            + box_row("❱ 640 │   │   │   │   logs = generate_step_logs(args, current_loss, avr_loss")
            + "╰" + "─" * 78 + "╯\n" + ERR)
    assert phase(text) in ("first_step", "training")


@pytest.mark.parametrize("source", [
    'logger.info(f"lr_scheduler: {args.lr_scheduler}")',
    'print(f"learning rate {args.learning_rate}")',
    "logs = {}",
])
def test_lines_that_only_name_the_learning_rate_setting_are_not_the_step(source):
    assert phase(_in_train(source)) not in ("first_step", "training")


@pytest.mark.parametrize("source", [
    'f"grad:{embedding.vec.grad.detach().cpu().abs().mean().item():.7f}"',
    "norm = p.grad.norm(2)",
    "total += param.grad.data.abs().sum()",
])
def test_gradients_read_after_the_backward_pass_are_the_step(source):
    path = "D:\\sd\\extensions\\DreamArtist\\scripts\\dream_artist\\cptuning.py"
    assert phase(_in_train(source, path)) in ("first_step", "training")


def test_a_gradient_setting_is_not_the_step():
    assert phase(_in_train("model.requires_grad_(False)")) not in ("first_step", "training")


@pytest.mark.parametrize("source, func", [
    ("save_embedding(embedding, optimizer, checkpoint, embedding_name, last_saved_file, remove_cached_checksum=True)",
     "train_embedding"),
    ("save_hypernetwork(hypernetwork, checkpoint, hypernetwork_name, last_saved_file)", "train_hypernetwork"),
    ("embedding.save(filename)", "save_embedding"),
])
def test_an_embedding_or_hypernetwork_saved_is_saving(source, func):
    path = "C:\\sd\\modules\\textual_inversion\\textual_inversion.py"
    assert phase(HEAD + frame(path, 368, func, source) + "OSError: [Errno 28] No space left on device\n") == "saving"


@pytest.mark.parametrize("text", [
    HEAD + frame("/w/sat/diffusion_video.py", 211, "log_video", 'log["reconstructions"] = self.decode_first_stage(z)'),
    HEAD + frame("/w/train.py", 400, "train", "self.log_videos(batch, step)"),
    HEAD + frame("/w/train.py", 400, "train", "log_video(model, samples, step=global_step)"),
])
def test_a_video_logged_like_a_sample_is_sampling(text):
    assert phase(text + "RuntimeError: boom\n") == "sampling"


@pytest.mark.parametrize("path, want", [
    ("/w/musubi/src/minimax_cache_text.py", "cache_text_encoder"),
    ("/w/musubi/wan_cache_text_encoder_outputs.py", "cache_text_encoder"),
    ("/w/musubi/cache_te_qwen.py", "cache_text_encoder"),
    ("/w/musubi/qwen_cache_latents.py", "cache_latents"),
    ("/w/musubi/cache_latent_wan.py", "cache_latents"),
])
def test_a_caching_script_named_for_what_it_caches_is_that_caching(path, want):
    text = (HEAD + frame(path, 303, "<module>", "main()") + frame(path, 248, "main", "encoder = load_model(args)")
            + "RuntimeError: boom\n")
    assert phase(text) == want


@pytest.mark.parametrize("path", ["/w/cache_test.py", "/w/test_cache.py", "/w/cached_latents_viewer.py"])
def test_other_scripts_with_cache_in_their_name_are_not_caching(path):
    text = HEAD + frame(path, 3, "<module>", "main()") + "RuntimeError: boom\n"
    assert phase(text) not in ("cache_text_encoder", "cache_latents")


@pytest.mark.parametrize("text", [
    HEAD + frame("/c/diffusers/examples/dreambooth/train_dreambooth.py", 535, "main", "import bitsandbytes as bnb")
    + frame("/usr/lib/python3.10/dist-packages/bitsandbytes/cextension.py", 27, "initialize")
    + "Exception: CUDA SETUP: Setup Failed!\n",
    # A paste whose markdown ate the underscores of __init__ and the <module> of its frame lines.
    'Traceback (most recent call last):\nFile "/c/train.py", line 803, in\nmain()\n'
    'File "/usr/lib/python3.10/dist-packages/bitsandbytes/init.py", line 6, in\nfrom .autograd._functions import (\n'
    "Exception: CUDA SETUP: Setup Failed!\n",
    HEAD + frame("/w/train.py", 90, "get_optimizer", "from bitsandbytes.optim import AdamW8bit")
    + "RuntimeError: CUDA Setup failed despite GPU being available.\n",
])
def test_bitsandbytes_imported_is_start_up(text):
    assert phase(text) == "model_load"


@pytest.mark.parametrize("source", [
    "data_cfg = json.load(data_config)[args.config_name]",
    "cfg = yaml.safe_load(open(config_path))",
    "conf = yaml.load(config_file, Loader=yaml.FullLoader)",
    "settings = toml.load(train_config)",
])
def test_a_configuration_read_with_json_or_yaml_is_start_up(source):
    text = HEAD + frame("/w/customize.py", 1209, "<module>", "main(args)") + frame("/w/customize.py", 458, "main", source)
    assert phase(text + "KeyError: 'comprehensive'\n") == "model_load"


@pytest.mark.parametrize("source", ["captions = json.load(f)", "meta = json.load(metadata_file)"])
def test_other_json_reads_are_not_a_configuration(source):
    text = HEAD + frame("/w/customize.py", 1209, "<module>", "main(args)") + frame("/w/customize.py", 458, "main", source)
    assert diagnose(parse_text(text + "KeyError: 'x'\n")).details.phase_evidence is None


@pytest.mark.parametrize("text", [
    HEAD + frame("/v/huggingface_hub/utils/_http.py", 409, "hf_raise_for_status")
    + "huggingface_hub.errors.GatedRepoError: 401 Client Error. Cannot access gated repo for url https://hf.co/x\n",
    HEAD + frame("/v/huggingface_hub/utils/_http.py", 409, "hf_raise_for_status")
    + "huggingface_hub.utils._errors.RepositoryNotFoundError: 404 Client Error. Repository Not Found for url\n",
])
def test_the_hub_refusing_a_model_is_start_up(text):
    assert phase(text) == "model_load"


def test_a_bare_forbidden_fetch_says_no_stage():
    text = (HEAD + frame("/v/requests/models.py", 1021, "raise_for_status")
            + "requests.exceptions.HTTPError: 403 Client Error: Forbidden for url: "
              "https://huggingface.co/runwayml/stable-diffusion-v1-5/resolve/main/model_index.json\n")
    assert phase(text) == "unknown"


@pytest.mark.parametrize("lines", [
    ["NOTE: Redirects are currently not supported in Windows or MacOs."],
    ["1.1 Pulling from dxqbyd/runpod-onetrainer-cli", "7197a8f60f79 Pull complete"],
    ["Status: Image is up to date for dxqbyd/runpod-onetrainer-cli:1.1"],
    ["create container dxqbyd/runpod-onetrainer-cli:1.1", "start container for dxqbyd/runpod-onetrainer-cli:1.1: begin",
     "error starting container: Error response from daemon: failed to create task for container"],
    ["waiting for public IP... Status: https://www.runpod.io/console/pods?id=1aalqegkuyu36i"],
    ["❯ bash train.sh", "/home/u/.venv/lib/python3.11/site-packages/nvidia/nvjitlink/lib"],
    ["➜ ./scripts/train_lora.sh"],
    ["Using wan_video_dit from ['models/Wan-AI/Wan2.1-T2V-14B/diffusion_pytorch_model-00001-of-00006.safetensors',"],
    ["Using text_encoder from \"models/umt5-xxl-enc-bf16.pth\""],
])
def test_the_host_launcher_or_a_model_manager_starting_the_job_is_start_up(lines):
    assert phase("\n".join(lines) + "\n") == "model_load"


@pytest.mark.parametrize("line", [
    "❯ ./start-ui.sh",
    "Using cache found in /root/.cache/torch/hub",
    "Using xformers for attention",
    "container stopped",
    "We are waiting for public feedback",
])
def test_other_lines_of_hosts_and_managers_say_no_stage(line):
    assert phase(line + "\n") == "unknown"


@pytest.mark.parametrize("line, message", [
    ("2024-08-16 03:19:30.487137: E external/local_xla/xla/stream_executor/cuda/cuda_fft.cc:485] Unable to register "
     "cuFFT factory", "Unable to register cuFFT factory"),
    ("2024-08-16 03:19:30.588940: I tensorflow/core/platform/cpu_feature_guard.cc:210] This TensorFlow binary is "
     "optimized", "This TensorFlow binary is optimized"),
    ("2023-01-02 10:00:00.123456: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT Warning: x",
     "TF-TRT Warning: x"),
])
def test_tensorflows_cpp_log_prefix_is_taken_off(line, message):
    assert clean(line) == message


@pytest.mark.parametrize("announce, bar, step", [
    ("Training at rate of 0.002 until step 3000", "  0%|          | 0/3000 [00:00<?, ?it/s]", 0),
    ("Training at rate of 0.005 until step 100", " 12%|█▏        | 12/100 [00:10<01:13,  1.20it/s]", 12),
])
def test_a_nameless_bar_counting_to_the_announced_steps_is_the_loop(announce, bar, step):
    text = f"{announce}\nPreparing dataset...\n100%|██████████| 65/65 [00:08<00:00,  7.46it/s]\n{bar}\n" + HEAD
    d = diagnose(parse_text(text))
    assert d.step == step and d.total_steps == int(announce.rsplit(" ", 1)[1])


def test_a_nameless_bar_with_another_total_is_not_the_loop():
    text = ("Training at rate of 0.002 until step 3000\nPreparing dataset...\n"
            "100%|██████████| 65/65 [00:08<00:00,  7.46it/s]\n")
    assert diagnose(parse_text(text)).step is None
