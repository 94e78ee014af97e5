"""Progress bars in every form their libraries print, built from each library's format (tqdm's
`format_meter` with and without `unit_scale` or a total, Rich's progress columns), never copied
from a labelled log; and lines that look like them but are not bars."""

from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.events import Milestone, Progress
from kohya_tuner.logparse.progress import count, match_bar

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
       "23.65 GiB of which 10.00 MiB is free.\n")


def _progress(text: str) -> list[Progress]:
    return [e for e in parse_text(text) if isinstance(e, Progress)]


# ---- tqdm's unit_scale counts -------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [("5.00", 5), ("30.0", 30), ("999", 999), ("1.02k", 1020),
                                         ("30.0k", 30000), ("1.50M", 1500000), ("0", 0), ("12", 12)])
def test_a_tqdm_count_reads_its_si_prefix(text, value):
    assert count(text) == value


@pytest.mark.parametrize("line, step, total", [
    ("steps:   3%|▎         | 1.02k/30.0k [10:01<4:40:10,  1.70it/s, avr_loss=0.11]", 1020, 30000),
    ("steps:  50%|#####     | 5.00/10.0 [00:05<00:05,  1.00it/s, avr_loss=0.2]", 5, 10),
    ("steps:  10%|█         | 150/1.50k [01:00<09:00,  2.50it/s, avr_loss=0.3]", 150, 1500),
    ("steps:   2%| 1.20k/60.0k [20:00<16:20:00,  1.00it/s, avr_loss=0.4]".replace("| ", "|          | "),
     1200, 60000),
])
def test_a_scaled_training_bar_gives_its_step_and_total(line, step, total):
    d = diagnose(parse_text(line + "\n" + OOM))
    assert (d.phase, d.step, d.total_steps) == ("training", step, total)


def test_a_scaled_bar_rate_reads_its_prefix():
    bar = match_bar("steps:  50%|#####     | 5.00k/10.0k [00:05<00:05,  1.02kit/s, avr_loss=0.2]")
    assert bar is not None and bar.rate == pytest.approx(1020.0)


def test_a_job_named_bar_with_scaled_counts_and_its_postfix_is_the_training_bar():
    text = "my_job:   3%|▎         | 1.02k/30.0k [12:01<5:41:10,  1.41it/s, lr: 1.0e-04 loss: 4.3e-01]\n" + OOM
    d = diagnose(parse_text(text))
    assert (d.phase, d.step, d.total_steps) == ("training", 1020, 30000)
    assert d.last_loss == pytest.approx(0.43)


@pytest.mark.parametrize("line", [
    "steps:  10%|█         | 1.0.2/30 [00:01<00:09,  1.00it/s]",   # not a number
    "steps:  10%|█         | 1.02x/30.0k [00:01<00:09,  1.00it/s]",  # not an SI prefix
    "version 1.02k/30.0k of the docs",                                # no percentage, no brackets
])
def test_what_only_resembles_a_scaled_bar_is_not_a_bar(line):
    assert match_bar(line) is None


# ---- tqdm without a total ----------------------------------------------------------------------

@pytest.mark.parametrize("line, step", [
    ("steps: 1021it [00:10, 102.10it/s, avr_loss=0.12]", 1021),
    ("steps: 1.02kit [00:10, 102.1it/s, avr_loss=0.12]", 1020),
    ("steps: 12it [01:02:03,  5.17s/it, avr_loss=0.12]", 12),
])
def test_a_training_bar_without_a_total_gives_its_step(line, step):
    d = diagnose(parse_text(line + "\n" + OOM))
    assert (d.phase, d.step, d.total_steps) == ("training", step, None)


def test_a_bar_without_a_total_reads_its_rate_either_way():
    assert match_bar("steps: 12it [01:00,  5.00s/it]").rate == pytest.approx(0.2)
    assert match_bar("steps: 12it [01:00,  3.20it/s]").rate == pytest.approx(3.2)


def test_a_side_bar_without_a_total_is_the_milestone_its_name_says():
    text = "Caching latents: 1021it [00:10, 102.10it/s]\n" + OOM
    d = diagnose(parse_text(text))
    assert d.phase == "cache_latents"


def test_a_nameless_bar_without_a_total_at_start_up_is_not_a_training_step():
    events = parse_text("Loading model\n37it [00:02, 15.1it/s]\n" + OOM)
    assert not [e for e in events if isinstance(e, Progress)]
    assert diagnose(events).phase == "model_load"


@pytest.mark.parametrize("line", [
    "It took 1021it [00:10, fine]",                 # no rate
    "reading 1021 items [00:10, 3.2it/s]",          # not tqdm's "{n}it"
    "commit [abc123] 1021it",                       # no elapsed time
])
def test_what_only_resembles_a_bar_without_a_total_is_not_a_bar(line):
    assert match_bar(line) is None


# ---- Rich progress bars ------------------------------------------------------------------------

@pytest.mark.parametrize("line, step, total", [
    ("steps ━━━━━━━━━━━━╸━━━━━━━━━━━━━━━━━━━━━━━━━━━ 12/100 0:00:05", 12, 100),
    ("steps ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━  45% 45/100 0:01:00 0:01:13", 45, 100),
    ("Training ━━━━━━━━━╺━━━━━━━━━━━━━━━━ 300/3000 0:10:00 • 1:30:00 0.50it/s loss: 0.123 lr: 1e-4", 300, 3000),
])
def test_a_rich_training_bar_gives_its_step_and_total(line, step, total):
    d = diagnose(parse_text(line + "\n" + OOM))
    assert (d.phase, d.step, d.total_steps) == ("training", step, total)


def test_a_rich_bar_at_zero_percent_is_the_first_step():
    d = diagnose(parse_text("steps ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━   0% -:--:--\n" + OOM))
    assert d.phase == "first_step"


def test_a_rich_bar_with_only_a_percentage_counts_no_step():
    assert _progress("steps ━━━━━━━━━━━━━━━━╸━━━━━━━━━━━━━━━━━━━━━━━  40% 0:00:12\n") == []


@pytest.mark.parametrize("line, phase", [
    ("Caching latents ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 40/100 0:00:12", "cache_latents"),
    ("Generating sample images ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 1/4 0:00:30", "sampling"),
])
def test_a_rich_side_bar_is_the_milestone_its_name_says(line, phase):
    events = parse_text("steps:  10%|█         | 300/3000 [01:00<09:00,  5.00it/s, avr_loss=0.1]\n" + line + "\n" + OOM)
    assert any(isinstance(e, Milestone) and e.phase == phase for e in events)
    assert diagnose(events).phase == phase


@pytest.mark.parametrize("line", [
    "┏━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓",                  # a heavy box's top
    "┡━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━┩",                  # a heavy table's head rule
    "━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━",                    # a bare rule
    "Section ━━ 12/100",                                    # two rules are a dash, not a bar
])
def test_rules_and_boxes_of_heavy_lines_are_not_bars(line):
    assert match_bar(line) is None


@pytest.mark.parametrize("postfix, loss", [("avr_loss=0.25", 0.25), ("loss=0.5, lr=1e-4", 0.5),
                                           ("lr: 1.0e-04 loss: 4.3e-01", 0.43), ("val_avg_loss=0.9", None)])
def test_a_bars_postfix_gives_the_training_loss_never_a_validation_loss(postfix, loss):
    from kohya_tuner.logparse.progress import bar_loss

    got = bar_loss(postfix)
    assert got == (pytest.approx(loss) if loss is not None else None)
