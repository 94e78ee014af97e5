"""Milestone lines: what a trainer prints as it moves from one phase to the next.

A mixin of the parser: `_milestone` reads one logical line and appends the Milestone, Saved,
Resumed, TotalSteps, EpochStart or Progress event it names. sd-scripts' own words come first;
other trainers' generic forms ("Saving <path>", "Saving at step N", "Loading … text encoder",
"Starting training step (N/M)") after them. `_side_bar` reads a named bar that is not the
training bar as such a line; `_report` reads a trainer's own report of a failure that names
its phase.
"""

from __future__ import annotations

import re

from kohya_tuner.logparse import frames as F
from kohya_tuner.logparse import patterns as P
from kohya_tuner.logparse import phase_words as PW
from kohya_tuner.logparse.oomfigures import oom_figures
from kohya_tuner.logparse.events import (
    REPORTED_WHERE, SETTINGS_PRINTED, EpochStart, Event, Failure, Finished, Milestone, Oom, Progress, Resumed,
    Saved, TotalSteps,
)

# A trainer's own step counter: "Starting training step (361/7200)", "STARTING AT STEP: 1/40000",
# "Starting from step 1/500" (that step begins, the one before it is done), "Step 120/2000" at the
# start of a line (that step is done).
STEP_OF_RE = re.compile(
    r"(?P<starting>(?:starting|beginning|begin|start)\s+(?:(?:at|from)\s+)?(?:training\s+|train\s+)?)?"
    r"step\s*:?\s*\(?\s*(?P<n>\d+)\s*/\s*(?P<total>\d+)\b", re.I)
# A training announcement naming how many steps its loop will run ("Training at rate of 0.005 until step
# 3000", "Training for 500 steps").
ANNOUNCED_STEPS_RE = re.compile(r"\buntil step (\d+)\b|\bfor (\d+) (?:training |optimi[sz]ation )?steps\b", re.I)
# A per-step training record with no total: the step, then the training loss ("Epoch 1 | iter 940
# step 235 | loss train: 0.35", "step: 120, loss: 0.31", "Step #2, loss: 0.12", "(step=0001005) Train Loss: 0.34",
# "global_step 80 | train_loss 0.2", DeepSpeed's "steps: 2 loss: nan iter time (s): 8.4"), or the step's optimizer
# record (DeepSpeed's "step=2, skipped=0, lr=[…]"). Anchored at the record's start so that prose naming a step
# is not one; a validation loss is not a step's.
STEP_RECORD_RE = re.compile(
    r"\(?(?:epoch[\s:=]*\d+\s*[|,]\s*)?(?:iter(?:ation)?[\s:=]*\d+\s*[|,]?\s*)?(?:global[_ ])?steps?[\s:=]*#?(?P<n>\d+)\)?"
    r"(?:\s*[|,]\s*|\s+)(?:(?:train(?:ing)?[_ ]?)?loss\b|skipped\s*[:=]\s*\d+\s*,\s*lr\s*[:=])", re.I)
# A record's tag naming the file, line and function that logged it (DeepSpeed's "[comm.py:675:init_distributed]").
_TAGGED_FUNC_RE = re.compile(r"\[[\w.\-]+\.py:\d+:(\w+)\]")
# A record naming the function the job enters ("Beginning compute_embeddings_for_prompts: […]", "Calling
# cache_latents()"): a snake_case name, so that ordinary words are not read as one.
_ENTERED_FUNC_RE = re.compile(
    r"(?:beginning|starting|entering|calling|running|executing) ([a-z_]\w*_\w+)(?:\(\))?(?=:|\s*$|\.\.\.|…)", re.I)
# Python's warning format: "<file>:<line>: <Category>Warning: <message>".
WARNING_AT_RE = re.compile(r"(.+?\.py):\d+: (?:[\w.]+\.)?\w*Warning: ")
# ComfyUI's error report: "- **Node Type:** FluxTrainLoop".
# A setting printed on a line of its own: "network_dim: 32", "lr_warmup_steps = 0", a table's
# "| network_dim | 32 |".
SETTING_ROW_RE = re.compile(r"\|?\s*([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\s*(?:\||:|=)\s*\S")
# A file a download bar is named by.
DOWNLOADED_FILE_RE = re.compile(r"[\w.\-/\\]{1,200}\.(?:json|model|safetensors|bin|txt|pth?|ckpt|gguf|msgpack|onnx|sft)$")
# A key of a printed mapping: "'save_every_n_steps': None".
MAPPING_KEY_RE = re.compile(r"'([a-z][a-z0-9]*(?:_[a-z0-9]+)+)': ")
# The same printed as argparse's Namespace ("Namespace(…, max_train_steps=1600, optimizer_type='Lion', …)").
NAMESPACE_KEY_RE = re.compile(r"(?:^|[(,] ?)([a-z][a-z0-9]*(?:_[a-z0-9]+)+)=")


def _argument_keys(s: str, rx: re.Pattern = MAPPING_KEY_RE) -> int:
    """How many keys of a printed mapping are sd-scripts argument names (multi-word ones)."""
    names = P.arg_names()
    return sum(1 for k in rx.findall(s[:4000]) if k in names)


NODE_TYPE_RE = re.compile(r"Node Type:\W*([A-Za-z_]\w*)|^Error occurred when executing ([A-Za-z_]\w*):")
# A line that names a model file written: "… model as StableDiffusion checkpoint to ./out/x.safetensors"
# (sd-scripts' words, their start cut by a paste), "Saved LoRA to /out/x.safetensors".
MODEL_FILE_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin")
SAVED_TO_RE = re.compile(r"(?:\bsav\w*\b.*|\bmodel as \S+ checkpoint|\bcheckpoint) to\s+(\S+)\s*$", re.I)
# A trainer reporting its own failure and the phase it failed in: "Error during training: …",
# "# OOM during training step, skipping batch #", "Text encoder caching failed". Lower-cased text;
# (pattern, phase) and the first that matches wins.
_REPORT_PHASES = (
    (r"caching latents|latents? caching|vae caching|caching vae", "cache_latents"),
    (r"caching text[ _-]?(?:encoders?(?: outputs)?|embeddings?|embeds)|text[ _-]?encoders? caching"
     r"|text[ _-]?embeds? caching", "cache_text_encoder"),
    (r"training(?:[ _]step)?|train(?:ing)?[ _]step|the training loop", "training"),
    # (A configuration's or the arguments' validation is a check at start-up, not a validation pass.)
    (r"sampling|(?<!configuration )(?<!config )(?<!argument )(?<!arguments )(?<!args )validation"
     r"|generating (?:sample )?images", "sampling"),
    (r"saving(?: the)?(?: model| checkpoint| state)?|checkpointing", "saving"),
    (r"model loading|loading(?: the)?(?: model| weights| checkpoint)?", "model_load"),
)
_REPORT_WORDS = "|".join(f"(?:{w})" for w, _ in _REPORT_PHASES)
FAILURE_REPORT_RE = re.compile(
    r"\b(?P<what>error|exception|failure|oom|out of memory|crash(?:ed)?)\s+(?:occurred\s+)?(?:during|while|in)\s+"
    r"(?:the\s+)?(?P<a>" + _REPORT_WORDS + r")(?![\w-])"
    r"|(?<![\w-])(?P<b>" + _REPORT_WORDS + r")\s+(?:has\s+|was\s+)?(?:failed|crashed|aborted)\b")
_STEP_NAMED_RE = re.compile(r"\bstep\s*#?\s*\d")
_PROCESS_EXIT_RE = re.compile(r"\s*(?:with (?:exit |return )?(?:code|status)|\(?exit(?:code| code| status))")
_REPORT_RX = tuple((re.compile(f"(?:{w})$"), phase) for w, phase in _REPORT_PHASES)


# A program failing to start the training it was asked for ("Failed to auto-start training: …", "Failed to
# start the training job"): the job's start-up failed.
_START_FAILED_RE = re.compile(r"\W*failed to (?:auto-?)?(?:start|launch|begin) (?:the )?(?:training|train job|job|run)\b")


def failure_report(low: str) -> tuple[str | None, bool] | None:
    """(phase, whether it reports an OOM) when a lower-cased line is a trainer's report of
    its own failure, the phase None where it names none ("Training failed: …"), else None."""
    if "failed to " in low and _START_FAILED_RE.match(low.lstrip(" *-#>")):
        return "model_load", bool(P.GPU_OOM_RE.search(low))
    m = FAILURE_REPORT_RE.search(low)
    if m is None or _PROCESS_EXIT_RE.match(low, m.end()):
        # "Musubi Tuner training failed with code 1": a process that exited, not a phase.
        return None
    words = m.group("a") or m.group("b")
    oom = m.group("what") in ("oom", "out of memory") or bool(P.GPU_OOM_RE.search(low))
    if m.group("b") == "training" and not _STEP_NAMED_RE.search(low):
        # "Training failed: ValueError …": the training job failed, which names no phase of it
        # ("the training step failed", "Step 0: Training failed" and "error during training" do).
        return None, oom
    phase = next((ph for rx, ph in _REPORT_RX if rx.match(words)), None)
    if phase is None:
        return None
    return phase, oom


# A line that gives a loss and a learning rate, each with its figure ("Loss: 0.0000 LR: 1.00e-05",
# "{'loss': 0.12, 'lr': 0.0001}", "loss=nan, learning_rate=1e-4").
_LOSS_FIGURE_RE = re.compile(r"\bloss\b['\"]?\s*[:=]?\s*-?(?:\d|\.\d|nan\b|inf\b)")
_LR_FIGURE_RE = re.compile(r"\b(?:lr|learning[ _]rate)\b['\"]?\s*[:=]?\s*\d")
STEP_FIGURES = "a step's loss and learning rate printed"

# The phases a bar at its total ends, and the milestone that says so.
_CACHING = {"cache_latents": "caching latents", "cache_text_encoder": "caching text encoder outputs"}
CACHING_DONE = "start-up after caching (the caching bar reached its total)"


class Milestones:
    _side: tuple[str, int] | None
    _said_phase: str | None
    _cache_ended: str | None
    _cache_done: Event | None
    _cache_done_desc: str | None
    _train_bar_total: int | None
    _before_training: bool
    _job_bar: str | None

    def _new_run(self) -> None:  # pragma: no cover - the parser defines it
        raise NotImplementedError

    def _logger(self, name: str, out: list[Event], message: str = "") -> None:  # pragma: no cover - the parser defines it
        raise NotImplementedError

    def _note_said(self, out: list[Event]) -> None:
        """The phase the milestone just read says (what a caching bar at its total ends)."""
        ev = out[-1] if out else None
        if isinstance(ev, Milestone):
            self._said_phase = ev.phase
            self._cache_ended = None
        elif isinstance(ev, (EpochStart, Progress)):
            self._said_phase = "training"
            self._cache_ended = None

    def _side_bar(self, desc: str, n: int, out: list[Event], total: int = 0) -> None:
        """A bar other than the training bar: its name read as a milestone (`_named_side_bar`).
        A caching bar that reached its total ends the caching: what follows, until another
        phase shows, is start-up (the trainer building what training needs). A nameless bar
        starting over right after it is the caching of the next dataset."""
        self._named_side_bar(desc, n, out)
        if not total:
            return
        said = self._said_phase
        if n >= total and said in _CACHING:
            self._cache_ended = said
            self._said_phase = "model_load"
            # Said only once something else is printed (`_end_caching`): a caching bar at its total
            # that is the last thing in the text leaves the run caching.
            self._cache_done = Milestone(phase="model_load", name=CACHING_DONE, line=f"{desc}{n}/{total}".strip())
            self._cache_done_desc = desc
        elif n < total and self._cache_ended and not desc.strip(" :"):
            phase, self._cache_ended = self._cache_ended, None
            self._said_phase = phase
            out.append(Milestone(phase=phase, name=_CACHING[phase], line=f"{n}/{total}"))

    def _end_caching(self, out: list[Event]) -> None:
        """Something else was printed after a caching bar at its total: the caching has ended."""
        if self._cache_done is not None:
            out.append(self._cache_done)
            self._cache_done = None

    def _cut_side_bar(self, desc: str, out: list[Event]) -> bool:
        """A named bar other than the training bar, cut before its count ("caching:   0%|",
        "Loading pipeline components:  40%|███" at the end of a paste): its name says what the
        trainer was doing, as the whole bar's would. False for a bar with no name."""
        if not desc.strip(" :"):
            return False
        self._flush_rich(out)
        self._flush_oom(out)
        last = self._side
        name = desc.strip().rstrip(":").strip()
        self._named_side_bar(desc, last[1] if last is not None and last[0] == name else 0, out)
        return True

    def _named_side_bar(self, desc: str, n: int, out: list[Event]) -> None:
        """A named bar other than the training bar says what the trainer is doing ("Loading
        pipeline components", "Caching latents to disk"): its description is read as a milestone
        line, once when the bar appears or starts again."""
        name = desc.strip().rstrip(":").strip()
        last = self._side
        self._side = (name, n)
        if not name and last is not None and last[0]:
            before = last[0].lower()
            for after, phase, what in PW.bars_after():
                if before.startswith(after):
                    out.append(Milestone(phase=phase, name=what, line=last[0]))
                    return
        if not name or (last is not None and last[0] == name and n >= last[1]):
            return
        if DOWNLOADED_FILE_RE.match(name):
            # A bar named by the file it fetches ("tokenizer_2/tokenizer_config.json", "spiece.model",
            # huggingface_hub's downloads): a model's files, before it is loaded.
            out.append(Milestone(phase="model_load", name="downloading the model", line=name[:200]))
            return
        found: list[Event] = []
        if self._milestone(name, found):
            out.extend(e for e in found if isinstance(e, (Milestone, EpochStart)) and getattr(e, "name", "") != "start")
            self._note_said(out)

    def _report(self, s: str, low: str, level: str | None, out: list[Event]) -> bool:
        """A trainer's own report of a failure that names the phase ("Error during training: …",
        "# OOM during training step #", "Training step failed: …"). Logged as information it places
        the failure reported around it; as an error (or a bare line) it is the failure."""
        found = failure_report(low)
        if found is None:
            return False
        phase, oom = found
        what = REPORTED_WHERE if phase is not None else None
        if level in ("INFO", "DEBUG", "WARNING"):
            if phase is None:
                return False
            out.append(Milestone(phase=phase, name=f"failure reported in {phase.replace('_', ' ')}", line=s))
            return True
        if oom:
            self._flush_oom(out)
            out.append(Oom(figures=oom_figures(s), where=phase, frame=what,
                           frame_level=1 if phase is not None else None, line=s))
            return True
        if level is None and not low.lstrip("#*=!- ").startswith(("error", "fatal", "exception", "failure")) \
                and "failed" not in low:
            return False
        kind = P.error_kind(s)
        out.append(Failure(kind=kind, message=s[:500], where=phase, frame=what,
                           frame_level=1 if phase is not None else None, line=s))
        return True

    def _flush_oom(self, out: list[Event]) -> None:  # pragma: no cover - the parser defines it
        raise NotImplementedError

    def _job_named_bar(self, desc: str) -> bool:
        """After words announcing the pass before training, the first bar whose name no phase
        word knows is the training bar, and so is every later update of it."""
        if desc == self._job_bar:
            return True
        name = desc.strip().rstrip(":").strip()
        if not self._before_training or not name:
            return False
        if self._milestone(name, []):
            return False
        self._before_training = False
        self._job_bar = desc
        return True

    def _milestone(self, s: str, out: list[Event]) -> bool:
        c = s[:1]
        if "train" in s or "sample" in s:
            low = s[:120].lower()
            if any(words in low for words in PW.before_training()):
                self._before_training = True
        if c == "(":
            m = PW.TAGS_RE.match(s)
            if m and m.end() < len(s):
                # SimpleTuner's "(VAECache) (Rank: 0) message": the tag may say the phase, the
                # message after it is read as any other.
                s = s[m.end():]
                if m.group("tag"):
                    self._logger(m.group("tag"), out, s)
        elif c == "[" and s[1:2] != "-":
            # ("[--option VALUE]" is argparse's usage text, not a tag.)
            m = PW.BRACKETS_RE.match(s)
            if m and m.end() < len(s):
                # DeepSpeed's "[logging.py:96:log_dist] [Rank 0] Saving model checkpoint: …".
                tag = _TAGGED_FUNC_RE.search(s, 0, m.end())
                s = s[m.end():]
                ev = F.frame_evidence([f"{tag.group(1)}(", f'File "?", line 0, in {tag.group(1)}']) if tag else None
                if ev is not None and ev.level <= 2:
                    # The function that logged it says the phase ("[comm.py:675:init_distributed]").
                    out.append(Milestone(phase=ev.diagnose_phase, name=f"logged from {tag.group(1)}", line=s))
                    return True
        elif c in "*=#" and len(s) > 1:
            # "***** Running training *****" (diffusers' scripts, the transformers Trainer).
            s = s.strip("*=# ")
        low = s[:48].lower()
        if "Warning: " in s:
            m = WARNING_AT_RE.match(s)
            ev = F.warning_evidence(m.group(1)) if m else None
            if ev is not None:
                # A warning raised where only one phase runs (the autograd engine: a backward pass).
                out.append(Milestone(phase=ev.diagnose_phase, name=f"a warning from {ev.what}", line=s))
                return True
        if "_" in s[:48] and not self._body_row:
            m = SETTING_ROW_RE.match(s)
            if m and not m.group(1).startswith("sample_") and m.group(1) in P.arg_names():
                # One of the job's settings printed by name ("network_dim: 32", "| unet_lr | 0 |",
                # "lr_warmup_steps = 0"), as a notebook, a GUI or the trainer's dataset summary does
                # when the job starts. Sampling prints its own (sample_*) settings.
                out.append(Milestone(phase="model_load", name=SETTINGS_PRINTED, line=s[:300]))
                return True
        if (s.count("': ") >= 4 and _argument_keys(s) >= 4) or (
                s.count("=") >= 4 and ", " in s and _argument_keys(s, NAMESPACE_KEY_RE) >= 4):
            # The job's parsed arguments printed as a mapping ({'output_dir': …, 'save_state': …}) or
            # as argparse's Namespace(…): printed once, as the job starts (a trainer's metrics name
            # no argument).
            out.append(Milestone(phase="model_load", name=SETTINGS_PRINTED, line=s[:300]))
            return True
        if (".py" in s or ".sh" in s or " launch " in s or "torchrun" in s or "deepspeed " in s) \
                and not s.startswith(("File ", "Traceback")) and "can't open file" not in s:
            # (The interpreter not finding the script is the failure, read in failures.py.)
            found = PW.command_phase(s.lower())
            if found is not None:
                # A command line that runs a caching script (musubi-tuner's, sd-scripts' tools), or
                # that starts a trainer (no phase until it says one).
                out.append(Milestone(phase=found[0], name=found[1], line=s, process=True))
                return True
        if low.startswith("generating sample images"):
            # sd-scripts names the step it samples after ("… at step / サンプル画像生成 ステップ: 200"):
            # that many steps are done, which a log cut before the next bar refresh shows nowhere else.
            m = P.SAMPLE_STEP_RE.search(s)
            if m:
                out.append(Progress(step=int(m.group(1)), total=0, line=s))
        if "step" in low:
            m = STEP_OF_RE.match(s)
            if m:
                n, total = int(m.group("n")), int(m.group("total"))
                if m.group("starting"):
                    # Training starts here: a bar with no description and this total is its bar.
                    self._train_bar_total = total
                out.append(Progress(step=max(0, n - 1) if m.group("starting") else n, total=total, line=s))
                return True
            m = STEP_RECORD_RE.match(s)
            if m:
                if m.group("n") == "0" and "skipped" in m.group(0).lower():
                    # DeepSpeed reports progress after every steps_per_print steps, and once at step 0
                    # as its engine is built: that one counts no step.
                    out.append(Milestone(phase="model_load", name="starting the DeepSpeed engine", line=s))
                    return True
                out.append(Progress(step=int(m.group("n")), total=0, line=s))
                return True
        if low.startswith(P.MILESTONE_HEADS):
            for prefix, phase, name in P.MILESTONE_PREFIXES:
                if low.startswith(prefix):
                    if phase == "training":
                        # "Start training LoRA Standard ...": a phrase that reads on past the
                        # words (a GUI naming the kind of job it starts) is the more specific.
                        found = PW.phrase_phase(s[:120].lower())
                        if found is not None:
                            out.append(Milestone(phase=found[0], name=found[1], line=s))
                            return True
                    if name == "start":
                        self._new_run()
                    elif phase == "training":
                        self._train_bar_total = 0
                    if phase == "model_load" and self._caching_te and P.TEXT_ENCODER_WORDS_RE.search(s.lower()):
                        # musubi-tuner loads a text encoder to cache its outputs (the sample
                        # prompts') and frees it again: that loading is part of the caching.
                        phase, name = "cache_text_encoder", "loading a text encoder to cache its outputs"
                    self._caching_te = phase == "cache_text_encoder"
                    out.append(Milestone(phase=phase, name=name, line=s))
                    return True
        if any(needle in low for needle in PW.phrase_needles()):
            found = PW.phrase_phase(s[:120].lower())
            if found is not None:
                if found[0] == "training":
                    m = ANNOUNCED_STEPS_RE.search(s)
                    if m:
                        # The loop's own bar, often printed with no description, counts to this.
                        self._train_bar_total = int(m.group(1) or m.group(2))
                out.append(Milestone(phase=found[0], name=found[1], line=s, process=found[1] in PW.process_phrases()))
                return True
        m = _ENTERED_FUNC_RE.match(s)
        if m:
            ev = F.frame_evidence([f"{m.group(1)}(", f'File "?", line 0, in {m.group(1)}'])
            if ev is not None and ev.level <= 2:
                # The function's name says the phase, as it would as a traceback's frame.
                out.append(Milestone(phase=ev.diagnose_phase, name=f"entering {m.group(1)}", line=s))
                return True
        c = low[:1]
        if "node type:" in low or low.startswith("error occurred when executing"):
            m = NODE_TYPE_RE.search(s)
            node = (m.group(1) or m.group(2)) if m else None
            ev = F.frame_evidence([node]) if node else None
            if ev is not None:
                # ComfyUI's error report names the node that raised ("Node Type: …", in older
                # versions "Error occurred when executing …:"); a trainer node's name says what
                # ran, read with the frame rules.
                out.append(Milestone(phase=ev.diagnose_phase, name=f"ComfyUI node {node}", line=s))
                return True
        if s.endswith(MODEL_FILE_SUFFIXES) and " to " in s and not low.startswith("load"):
            m = SAVED_TO_RE.search(s)
            if m:
                out.append(Saved(what="checkpoint", path=m.group(1), line=s))
                return True
        if "ncoder" in s[:120]:
            m = P.LOADING_TEXT_ENCODER_RE.search(s[:120].lower())
            if m and self._caching_te:
                out.append(Milestone(phase="cache_text_encoder", name="loading a text encoder to cache its outputs",
                                     line=s))
                return True
            if m:
                # Any trainer's "… loading the T5 text encoder …", wherever its logger puts the words.
                out.append(Milestone(phase="model_load", name="loading the text encoder", line=s))
                return True
        if c == "a" and low.startswith("accelerator device"):
            m = P.ACCEL_DEVICE_RE.search(s)
            device = m.group(1) if m else "?"
            out.append(Milestone(phase="model_load", name=f"accelerator device: {device}", line=s))
            return True
        if c == "s":
            m = P.SAVING_CKPT_RE.match(s) if low.startswith(("saving checkpoint", "saved checkpoint")) else None
            if m:
                out.append(Saved(what="checkpoint", path=m.group(1), line=s))
                return True
            elif low.startswith("saving current state to"):
                m = P.SAVING_STATE_RE.match(s)
                if m:
                    out.append(Saved(what="state", path=m.group(1), line=s))
                    return True
            elif low.startswith("save trained model as"):
                m = P.SAVE_TRAINED_RE.match(s)
                if m:
                    out.append(Saved(what="checkpoint", path=m.group(1), line=s))
                    return True
            elif low.startswith("saving ") and P.SAVING_GENERIC_RE.match(s):
                # Other trainers' "Saving at step 300" (ai-toolkit), "Saving <path>" (OneTrainer).
                out.append(Milestone(phase="saving", name="saving the model", line=s))
                return True
            elif low.startswith("skipping "):
                m = P.SKIPPING_RE.match(s)
                if m:
                    out.append(Resumed(skipped=int(m.group(1)), line=s))
                    return True
        elif c == "m":
            if s.startswith("model saved."):
                out.append(Finished(line=s))
                return True
        elif c == "r":
            if low.startswith("resume training from"):
                m = P.RESUME_RE.match(s)
                out.append(Resumed(path=m.group(1) if m else None, line=s))
                return True
        elif c == "t" or c == "o":
            if low.startswith(("total optimization steps", "override steps")):
                m = P.TOTAL_STEPS_RE.search(s.lower())
                if m:
                    out.append(TotalSteps(total=int(m.group(1)), line=s))
                    return True
        elif c == "e":
            if low.startswith("epoch "):
                m = P.EPOCH_RE.match(s)
                if m:
                    out.append(EpochStart(epoch=int(m.group(1)), total=int(m.group(2)), line=s))
                    return True
                m = P.GLOBAL_STEP_RE.match(s)
                if m:
                    # PyTorch Lightning's checkpoint callback: "Epoch 0, global step 499: …".
                    out.append(Progress(step=int(m.group(1)), total=0, line=s))
                    return True
        if "oss" in s[:300]:
            head = s[:300].lower()
            if _LOSS_FIGURE_RE.search(head) and _LR_FIGURE_RE.search(head):
                # A trainer's own progress display ("Training Step … Loss: 0.0000 LR: 1.00e-05", a
                # metrics dict): a step's loss and learning rate, printed only while steps run.
                out.append(Milestone(phase="training", name=STEP_FIGURES, line=s[:300]))
                return True
        return False

