"""`run --continue DIR --dry-run`: what continuing would launch, with nothing launched
and nothing written (the journal, the attempt configs and the logs stay as they are)."""

from __future__ import annotations

import os
from typing import Any

from kohya_tuner.run.journal import Journal
from kohya_tuner.run.policy import Retry
from kohya_tuner.run.settings import RunSettings, command_for, probe_config
from kohya_tuner.run.states import attempt_config


def starts(action: Retry, total: int, *, probe: bool = False) -> str:
    """Where the attempt `action` describes starts, in words: a saved state (optimizer and
    schedule too), saved LoRA weights with a fresh optimizer, or step 0."""
    if probe:
        return f"runs a {total}-step probe from step 0"
    left = total - action.start_step
    if action.resume_from:
        return (f"resumes from the state {action.resume_from} at step {action.start_step} (weights, optimizer and "
                f"schedule as saved) and trains the {left} steps left")
    if action.weights_from:
        return (f"continues from the LoRA weights {action.weights_from} of step {action.start_step} with a fresh "
                f"optimizer and a scheduler set to the planned learning-rate curve at step {action.start_step} "
                f"(network_weights), and trains the {left} steps left")
    return f"starts from step 0 and trains all {total} steps"


def continuation_preview(journal: Journal, settings: RunSettings, action: Retry, *, probe: bool) -> dict[str, Any]:
    from kohya_tuner.run import launcher

    attempt = journal.next_attempt_number()
    cfg_path = journal.config_path(attempt)
    total = settings.probe_steps if probe else settings.total_steps
    config = probe_config(action.config, total, settings.out_dir) if probe else action.config
    if action.sample_size and config.get("sample_prompts") and not probe:
        from kohya_tuner import prompts

        # The copy with smaller previews the attempt would draw from (written only when it starts).
        config = {**config, "sample_prompts": str(settings.out_dir / prompts.copy_name(
            str(config["sample_prompts"]), attempt))}
    # As the loop builds it (run/loop.py, Supervisor._attempt), so the preview is the command.
    run_config = attempt_config(config, resume_from=action.resume_from, resume_step=action.start_step,
                                total_steps=total, attempt=None if probe else attempt,
                                weights_from=None if probe else action.weights_from)
    argv, env = command_for(settings, cfg_path, run_config)
    return {
        "dry_run": True, "continue": str(settings.out_dir), "attempt": attempt, "reason": action.reason,
        "note": action.note, "resume_from": action.resume_from, "start_step": action.start_step,
        "weights_from": None if probe else action.weights_from, "starts": starts(action, total, probe=probe),
        "changes": [c.__dict__ for c in action.changes], "attempt_config": str(cfg_path),
        "log_file": str(journal.log_path(attempt)), "command": argv,
        "command_line": launcher.format_command(argv), "environment": launcher.env_changes(env, os.environ),
    }
