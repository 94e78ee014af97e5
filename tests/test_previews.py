"""Sample previews: the estimator counts the prompt file's --w/--h, and a plan that writes its
own prompt file draws smaller previews before it turns sampling off."""

from __future__ import annotations

import json

import pytest

from kohya_tuner import memory, presets
from kohya_tuner.families import get_family
from kohya_tuner.memory.setup import SAMPLE_SIZE_KEY
from tests.clihelp import invoke

SDXL = get_family("sdxl")


def _sampling_config(tmp_path, text: str | None, name: str = "prompts.txt") -> dict:
    plan = presets.compose("sdxl", "character", 24)
    cfg = dict(plan.config)
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    cfg["sample_prompts"] = str(path)
    return cfg


def _sampling(cfg) -> tuple[float, list[str]]:
    est = memory.estimate(cfg, SDXL)
    return est.phases_gib["sampling"], est.assumptions


def test_the_estimate_follows_the_prompt_files_sizes(tmp_path):
    big, said = _sampling(_sampling_config(tmp_path, "a cat --w 1024 --h 1024 --d 1\n", "big.txt"))
    small, said_small = _sampling(_sampling_config(tmp_path, "# a comment --w 4096 --h 4096\n"
                                                   "a cat --w 512 --h 512 --d 1\n", "small.txt"))
    assert small < big - 0.5
    assert any("512x512" in a and "small.txt" in a for a in said_small)
    # A line without --w/--h is drawn at sd-scripts' 512 px default; the largest line sets the peak.
    default, _ = _sampling(_sampling_config(tmp_path, "a cat\n", "default.txt"))
    assert default == pytest.approx(small)
    mixed, _ = _sampling(_sampling_config(tmp_path, "a cat --w 512 --h 512\na dog --w 1024 --H 1024\n", "mix.txt"))
    assert mixed == pytest.approx(big)


def test_an_unreadable_prompt_file_counts_the_training_resolution_and_says_why(tmp_path):
    plan_res, _ = _sampling(_sampling_config(tmp_path, "a cat --w 1024 --h 1024\n", "train.txt"))
    missing, said = _sampling(_sampling_config(tmp_path, None, "missing.txt"))
    assert missing == pytest.approx(plan_res)
    assert any("training resolution" in a and "missing.txt" in a and "does not exist" in a for a in said)
    # Bounded: a file past the limit is not read whole.
    huge = _sampling_config(tmp_path, "a cat --w 512 --h 512\n" * 60_000, "huge.txt")
    _, said = _sampling(huge)
    assert any("training resolution" in a and "bytes" in a for a in said)


def test_sdxl_on_12_gb_keeps_sampling_with_smaller_previews_the_file_says(tmp_path):
    res = invoke("config", "--model", "sdxl", "--job", "character", "--gpu", "12", "--out", tmp_path / "o", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["config"].get("sample_every_n_steps"), "sampling must stay on"
    changes = [c for st in data["steps"] for c in st["changes"]]
    size = next(c["new"] for c in changes if c["key"] == "sample_prompts.txt --w/--h")
    w, h = (int(v) for v in size.split("x"))
    assert max(w, h) < 1024 and SAMPLE_SIZE_KEY not in data["config"]
    text = (tmp_path / "o" / "sample_prompts.txt").read_text()
    assert f"--w {w} --h {h}" in text and "--w 1024" not in text
    assert SAMPLE_SIZE_KEY not in (tmp_path / "o" / "config.toml").read_text()
    # What the plan counted is what `estimate` reads back from the files written.
    back = invoke("estimate", tmp_path / "o" / "config.toml", "--gpu", "12", "--json")
    assert json.loads(back.stdout)["peak_gib"] == pytest.approx(data["estimate"]["peak_gib"], abs=0.01)


def test_sampling_goes_off_only_when_no_smaller_preview_fits(tmp_path):
    # SDXL at 8 GB: the fp32 text encoders sampling brings back leave no room at any preview size.
    res = invoke("config", "--model", "sdxl", "--job", "character", "--gpu", "8", "--out", tmp_path / "o", "--json")
    data = json.loads(res.stdout)
    assert "sample_every_n_steps" not in data["config"]
    moves = [st["move"] for st in data["steps"]]
    assert "sample_less" in moves and "sample_smaller" not in moves
    plan = presets.compose("sdxl", "character", 8)
    cfg = {**plan.config, "sample_prompts": str(tmp_path / "p.txt"), SAMPLE_SIZE_KEY: "512x512"}
    assert memory.estimate(cfg, SDXL).phases_gib["sampling"] > data["budget_gib"]


def test_fit_of_a_users_config_never_writes_the_plans_preview_key(tmp_path):
    res = invoke("config", "--model", "sdxl", "--job", "character", "--gpu", "24", "--out", tmp_path / "o")
    assert res.exit_code == 0, res.output
    res = invoke("fit", tmp_path / "o" / "config.toml", "--gpu", "12", "--out", tmp_path / "f.toml", "--json")
    assert res.exit_code == 0, res.output
    assert SAMPLE_SIZE_KEY not in (tmp_path / "f.toml").read_text()
    # It cannot rewrite your prompt file, so it turns sampling off and says which size would fit.
    data = json.loads(res.stdout)
    assert "sample_less" in [st["move"] for st in data["steps"]]
    hint = next(h for h in data["hints"] if h.startswith("previews at "))
    size = hint.split()[2]
    assert "sample_prompts.txt" in hint and f"--w {size.split('x')[0]}" in hint
    prompts = tmp_path / "o" / "sample_prompts.txt"
    w, h = size.split("x")
    prompts.write_text(prompts.read_text().replace("--w 1024 --h 1024", f"--w {w} --h {h}"))
    again = json.loads(invoke("fit", tmp_path / "o" / "config.toml", "--gpu", "12", "--out", tmp_path / "g.toml",
                              "--json").stdout)
    assert "sample_less" not in [st["move"] for st in again["steps"]], again["steps"]


# ---- .toml and .json prompt files (library/train_util.py load_prompts: width / height) -------

_TOML_BIG = '[prompt]\nwidth = 1024\nheight = 1024\n\n[[prompt.subset]]\nprompt = "a cat"\n\n[[prompt.subset]]\nprompt = "a dog"\n'
_TOML_SUBSETS = ('[prompt]\nsample_steps = 20\n\n[[prompt.subset]]\nprompt = "a cat"\nwidth = 512\nheight = 512\n\n'
                 '[[prompt.subset]]\nprompt = "a dog"\nwidth = 1024\nheight = 768\n')
_JSON_BIG = '[{"prompt": "a cat", "width": 1024, "height": 1024}, "a dog --w 512 --h 512"]'
_JSON_LINES = '["a cat --w 512 --h 512", {"prompt": "a dog"}]'


@pytest.mark.parametrize("name,text,size", [
    ("shared.toml", _TOML_BIG, "1024x1024"), ("subsets.toml", _TOML_SUBSETS, "1024x768"),
    ("big.json", _JSON_BIG, "1024x1024"), ("lines.json", _JSON_LINES, "512x512"),
])
def test_toml_and_json_prompt_files_are_read_for_their_sizes(tmp_path, name, text, size):
    """sd-scripts draws the previews of a .toml / .json prompt file at its width / height; the
    estimate counts those, not the training resolution."""
    est, said = _sampling(_sampling_config(tmp_path, text, name))
    w, h = (int(x) for x in size.split("x"))
    txt, _ = _sampling(_sampling_config(tmp_path, f"a cat --w {w} --h {h}\n", f"same-{name}.txt"))
    assert est == pytest.approx(txt)
    assert any(size in a and name in a for a in said), said


@pytest.mark.parametrize("name,text", [("bad.toml", "[prompt\nwidth = 1"), ("bad.json", "[{"),
                                       ("deep.json", "[" * 5000 + "]" * 5000), ("nan.json", '[{"width": NaN}]')])
def test_a_damaged_toml_or_json_prompt_file_counts_the_training_resolution_and_says_why(tmp_path, name, text):
    train, _ = _sampling(_sampling_config(tmp_path, "a cat --w 1024 --h 1024\n", "train.txt"))
    est, said = _sampling(_sampling_config(tmp_path, text, name))
    assert est == pytest.approx(train)
    assert any("training resolution" in a and name in a for a in said), said


@pytest.mark.parametrize("name,text", [("p.txt", "# keep --w 4096\n\na cat --w 1024 --h 768 --d 3\na dog --w 256 --h 256\n"),
                                       ("p.toml", _TOML_BIG), ("s.toml", _TOML_SUBSETS), ("p.json", _JSON_BIG)])
def test_smaller_previews_rewrite_only_what_is_too_large(tmp_path, name, text):
    from kohya_tuner import prompts

    path = tmp_path / name
    path.write_text(text)
    before = prompts.sizes(prompts.load(str(path)), 512)
    new = tmp_path / f"new-{name}"
    new.write_text(prompts.smaller(prompts.load(str(path)), 512, 512))
    after = prompts.sizes(prompts.load(str(new)), 512)
    assert len(after) == len(before)
    for (w, h), (nw, nh) in zip(before, after):
        if max(w, h) <= 512:
            assert (nw, nh) == (w, h)
        else:
            assert max(nw, nh) == 512 and nw % 64 == 0 and nh % 64 == 0
            assert abs(nw / nh - w / h) < 0.2  # the aspect is kept
    if name.endswith(".toml"):
        import toml

        doc = toml.loads(new.read_text())
        # sd-scripts builds each prompt as dict(**shared, **subset): a size in both is a duplicate keyword.
        for sub in doc["prompt"]["subset"]:
            dict(**{k: v for k, v in doc["prompt"].items() if k != "subset"}, **sub)
    if name.endswith(".txt"):
        lines = new.read_text().splitlines()
        assert lines[0] == "# keep --w 4096" and "--d 3" in lines[2] and lines[3] == "a dog --w 256 --h 256"
