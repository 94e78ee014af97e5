"""How fast `diagnose` reads a large training log, streaming, and how much memory it needs.

Writes a synthetic log of about --mb megabytes to a temporary folder and diagnoses it from
disk the way `kohya-tuner diagnose` does (chunk by chunk, bar updates coalesced), then prints
lines/s, MB/s (wall and CPU) and peak RSS. The log is what long runs produce, tqdm updates and
INFO lines: bar updates joined by carriage returns (sd-scripts in a terminal) and the same bar
logged one update per line behind FluxGym's `[time] [INFO]` prefix, Rich records wrapped at
80 columns, coloured Rich records (ANSI), plain `logging` INFO lines, epoch headers, saves,
and an occasional traceback and OOM.

    python benchmarks/logparse_speed.py [--mb 200] [--streaming]

--streaming measures `run`'s use instead: every line fed separately to `LogParser.feed`, every
bar update its own event.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

_RICH = [
    "2026-11-30 03:06:28 INFO     saving state at step {s}           train_util.py:5964",
    "                    INFO     Saving current state to         accelerator.py:3241",
    "                             /data/runs/out-oom/cpu_lora-ste                    ",
    "                             p{s:08d}-state                                     ",
    "                    INFO     epoch is incremented.             train_util.py:784",
    "                             current_epoch: 0, epoch: 1                         ",
]
_ANSI_RICH = ("\x1b[2;36m[11/30/26 03:06:28]\x1b[0m\x1b[2;36m \x1b[0m\x1b[34mINFO    \x1b[0m checkpoint {s} written "
              "to disk            \x1b[2mtrain_util.py\x1b[0m\x1b[2m:\x1b[0m\x1b[2m5964\x1b[0m")
_PLAIN_INFO = "2026-11-30 03:06:{sec:02d},{ms:03d} - INFO - step {s}: lr 1.0e-04, grad norm 0.{g:03d}"
_TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/opt/sdscripts/train_network.py", line 1913, in <module>',
    "    trainer.train(args)",
    '  File "/opt/sdscripts/train_network.py", line 1445, in train',
    "    accelerator.backward(loss)",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
]
_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "7.75 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 6.62 GiB memory in use. "
        "Of the allocated memory 5.91 GiB is allocated by PyTorch, and 498.27 MiB is reserved by PyTorch but "
        "unallocated. See documentation for Memory Management  (https://pytorch.org/docs)")


def write_log(path: Path, megabytes: float) -> int:
    """A log of about `megabytes` MB; returns the number of lines (\\n and \\r separated).

    Sections of 2,000 steps alternate between two captures of the same trainer: a terminal
    (bar updates joined by \\r, two per step; Rich records every 200 steps; two `logging` INFO
    lines every 40 steps) and FluxGym (every line behind its "[time] [INFO]" prefix, one bar
    update per line)."""
    target = int(megabytes * 1_000_000)
    total = 1_000_000
    lines = 0
    written = 0
    step = 0
    with open(path, "w", encoding="utf-8", newline="") as fh:
        while written < target:
            block = []
            fluxgym = (step // 2000) % 2 == 1
            for _ in range(40):
                step += 1
                pct = step * 100 // total
                bar = f"steps: {pct:3d}%|{'█' * (pct // 10):<10}| {step}/{total} [1:02:03<2:03:04,  1.49s/it"
                if fluxgym:
                    block.append(f"[2024-09-18 08:19:{step % 60:02d}] [INFO] {bar}, avr_loss=0.{step % 997:03d}]\n")
                else:
                    block.append(f"\r{bar}]\r{bar}, avr_loss=0.{step % 997:03d}]")
            info = [_PLAIN_INFO.format(sec=i, ms=step % 1000, s=step, g=(step * 7) % 1000) for i in range(2)]
            if step % 200 == 0:
                info += [r.format(s=step) for r in _RICH] + [_ANSI_RICH.format(s=step), "", "epoch 3/40", ""]
            if step % 200_000 < 40:
                info += _TRACEBACK + [_OOM]
            if fluxgym:
                block.append("".join(f"[2024-09-18 08:19:{step % 60:02d}] [INFO] {x}\n" for x in info))
            else:
                block.append("\n" + "\n".join(info) + "\n")
            text = "".join(block)
            fh.write(text)
            written += len(text.encode("utf-8"))
            lines += text.count("\n") + text.count("\r")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200.0, help="size of the synthetic log in MB (default 200)")
    ap.add_argument("--streaming", action="store_true", help="feed line by line, every bar update an event (run)")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from kohya_tuner.logparse import LogParser, Oom, Progress, diagnose
    from kohya_tuner.logparse.reader import iter_events, open_log

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.log"
        t0 = time.perf_counter()
        lines = write_log(path, args.mb)
        size = path.stat().st_size
        print(f"wrote {size / 1e6:.1f} MB, {lines:,} lines in {time.perf_counter() - t0:.1f} s")
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        counts = {"progress": 0, "oom": 0, "other": 0}

        def counted(stream):
            for ev in stream:
                if isinstance(ev, Progress):
                    counts["progress"] += 1
                elif isinstance(ev, Oom):
                    counts["oom"] += 1
                else:
                    counts["other"] += 1
                yield ev

        def streamed():
            parser = LogParser()
            with open(path, encoding="utf-8", newline="") as fh:
                for line in fh:
                    yield from parser.feed(line)
            yield from parser.finish()

        t0 = time.perf_counter()
        c0 = time.process_time()
        source = streamed() if args.streaming else iter_events(open_log(path), coalesce_progress=True)
        diagnosis = diagnose(counted(source))
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    mode = "streaming (run: line by line, every update an event)" if args.streaming else "diagnose"
    print(f"{mode}: parsed + diagnosed in {elapsed:.2f} s: {lines / elapsed:,.0f} lines/s, "
          f"{size / 1e6 / elapsed:.1f} MB/s")
    # On a shared machine the wall clock includes other processes' time; CPU time does not.
    print(f"CPU time {cpu:.2f} s: {lines / cpu:,.0f} lines/s, {size / 1e6 / cpu:.1f} MB/s of CPU")
    print(f"events: {counts['progress']:,} progress, {counts['oom']} oom, {counts['other']:,} other; "
          f"diagnosis: {diagnosis.outcome} / {diagnosis.phase} at step {diagnosis.step}")
    print(f"peak RSS: {peak:.0f} MiB (before parsing {rss_before:.0f} MiB; the log is {size / 2**20:.0f} MiB)")
    if os.environ.get("KT_BENCH_STRICT") and peak - rss_before > size / 2**20 / 4:
        raise SystemExit("parsing held a large part of the log in memory")


if __name__ == "__main__":
    main()
