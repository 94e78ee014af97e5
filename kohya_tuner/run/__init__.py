"""The run stage: `kohya-tuner run` trains, watches, and recovers from out-of-memory.

  request.py       what `run` is asked (RunRequest, ContinueRequest) and what planning hands back
  start.py         prepare (plan, check, write), prepare_continue, supervise: the CLI's one way in
  policy.py        the pure decide(): retry with which settings, or stop, after an attempt
  progress.py      absolute optimizer steps of one attempt from the log reader's events
  states.py        resume keys for an attempt and which saved state a relaunch uses
  settings.py      what stays fixed across attempts (run.json) and the launch command
  loop.py          the Supervisor: launch, watch, decide, relaunch, summary
  continuation.py  where `run --continue OUT` picks up
  journal.py       the files a run leaves in its output folder
  report.py        report.html
  launcher.py      accelerate launch: argv, environment, process group, pipe reader, watchdog
  preflight.py     checks before the first launch (images, GPU, RAM, disk, trainer's Python)
  emulate/         the sitecustomize behind --emulate-vram
"""
