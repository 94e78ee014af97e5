"""Milestone lines: what a trainer prints as it moves from one phase to the next.

A mixin of the parser: `_milestone` reads one logical line and appends the Milestone, Saved,
Resumed, TotalSteps, EpochStart or Progress event it names. sd-scripts' own words come first;
other trainers' generic forms ("Saving <path>", "Saving at step N", "Loading … text encoder")
after them.
"""

from __future__ import annotations

from kohya_tuner.logparse import patterns as P
from kohya_tuner.logparse.events import EpochStart, Event, Finished, Milestone, Progress, Resumed, Saved, TotalSteps


class Milestones:
    def _new_run(self) -> None:  # pragma: no cover - the parser defines it
        raise NotImplementedError

    def _milestone(self, s: str, out: list[Event]) -> bool:
        low = s[:48].lower()
        if low.startswith("generating sample images"):
            # sd-scripts names the step it samples after ("… at step / サンプル画像生成 ステップ: 200"):
            # that many steps are done, which a log cut before the next bar refresh shows nowhere else.
            m = P.SAMPLE_STEP_RE.search(s)
            if m:
                out.append(Progress(step=int(m.group(1)), total=0, line=s))
        if low.startswith(P.MILESTONE_HEADS):
            for prefix, phase, name in P.MILESTONE_PREFIXES:
                if low.startswith(prefix):
                    if name == "start":
                        self._new_run()
                    out.append(Milestone(phase=phase, name=name, line=s))
                    return True
        c = low[:1]
        if "ncoder" in s[:120]:
            m = P.LOADING_TEXT_ENCODER_RE.search(s[:120].lower())
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
            if low.startswith("saving checkpoint"):
                m = P.SAVING_CKPT_RE.match(s)
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
                m = P.TOTAL_STEPS_RE.search(s)
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
        return False

