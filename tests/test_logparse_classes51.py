"""Round 51, behind batches 138 and 141's misses: DeepSpeed reducing gradients across ranks (a part of the
backward pass no other stage runs), and ai-toolkit's per-image sampling function. Several forms each, and frames
of the same libraries that belong to other stages."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text

_DS = "/opt/conda/lib/python3.10/site-packages/deepspeed/runtime"


def _traceback(*frames: tuple[str, int, str, str], error: str = "IndexError: list index out of range") -> str:
    rows = ["Traceback (most recent call last):"]
    for path, line, func, src in frames:
        rows += [f'  File "{path}", line {line}, in {func}', f"    {src}"]
    return "\n".join(rows + [error]) + "\n"


@pytest.mark.parametrize("frames", [
    [(f"{_DS}/engine.py", 2160, "allreduce_gradients", "self.optimizer.overlapping_partition_gradients_reduce_epilogue()"),
     (f"{_DS}/zero/stage_1_and_2.py", 1453, "reduce_ipg_grads", "self.average_tensor(bucket.buffer[0])")],
    [(f"{_DS}/zero/stage_1_and_2.py", 1012, "average_tensor", "dist.all_reduce(tensor)")],
    [(f"{_DS}/zero/stage3.py", 1190, "reduce_independent_p_g_buckets_and_remove_grads", "self.__reduce_and_partition_ipg_grads()")],
    [(f"{_DS}/engine.py", 1899, "allreduce_bucket", "dist.all_reduce(tensor_to_allreduce, group=dp_group)")],
    [("C:\\env\\Lib\\site-packages\\deepspeed\\runtime\\zero\\stage_1_and_2.py", 880, "reduce_ready_partitions_and_remove_grads",
      "self.reduce_independent_p_g_buckets_and_remove_grads(param, i)")],
])
def test_deepspeed_reducing_gradients_is_the_training_step(frames):
    d = diagnose(parse_text(_traceback(*frames)))
    assert d.outcome == "error" and d.phase in ("first_step", "training"), d.phase


def test_deepspeed_reducing_gradients_in_a_rich_box_is_the_training_step():
    box = ("╭──────────── Traceback (most recent call last) ────────────╮\n"
           f"│ {_DS}/zero/stage_1_and_2.py:1453 in reduce_ipg_grads │\n"
           "│                                                            │\n"
           "│ ❱ 1453 │   │   self.average_tensor(bucket.buffer[0])      │\n"
           "╰────────────────────────────────────────────────────────────╯\n"
           "IndexError: list index out of range\n")
    assert diagnose(parse_text(box)).phase in ("first_step", "training")


@pytest.mark.parametrize("frames", [
    # The engine's start-up: ZeRO's optimizer built (its flat buffers allocated), not a step.
    [(f"{_DS}/engine.py", 1234, "_configure_zero_optimizer", "optimizer = DeepSpeedZeroOptimizer("),
     (f"{_DS}/zero/stage_1_and_2.py", 310, "__init__", "self.flatten_dense_tensors_aligned(")],
    # A user's own function that only shares a word with the reduction.
    [("/home/u/train.py", 40, "average_tensor_list", "out = sum(ts) / len(ts)")],
])
def test_other_deepspeed_frames_and_lookalikes_are_not_the_step(frames):
    d = diagnose(parse_text(_traceback(*frames, error="RuntimeError: something failed")))
    assert d.phase not in ("first_step", "training"), d.phase


@pytest.mark.parametrize("frames", [
    [("/ai-toolkit/toolkit/models/base_model.py", 812, "generate_images", "gen_images = self.generate_single_image("),
     ("/ai-toolkit/extensions_built_in/diffusion_models/qwen_image/qwen_image.py", 579, "generate_single_image",
      "return pipeline("),
     ("/ai-toolkit/extensions_built_in/diffusion_models/qwen_image/src/pipeline.py", 389, "__call__",
      "noise_pred = run_transformer(")],
    [("C:\\ai-toolkit\\extensions_built_in\\diffusion_models\\wan22\\wan22_14b_model.py", 301, "generate_single_image",
      "noise_pred = self.model(")],
])
def test_ai_toolkits_per_image_sampler_is_sampling_even_over_a_prediction(frames):
    text = "Generating baseline samples before training\n" + _traceback(*frames, error="torch.OutOfMemoryError: CUDA "
                                                                                     "out of memory. Tried to allocate 2.00 GiB")
    assert diagnose(parse_text(text)).phase == "sampling"


def test_a_step_that_calls_something_else_named_like_it_is_still_the_step():
    text = _traceback(("/home/u/train.py", 200, "train_step", "noise_pred = unet(noisy_latents, t, emb)"),
                      ("/home/u/train.py", 90, "generate_single_image_caption", "return cap(x)"))
    assert diagnose(parse_text(text)).phase in ("first_step", "training")
