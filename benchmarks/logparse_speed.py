"""How fast the log parser reads a large training log, streaming, and how much memory it needs.

Writes a synthetic sd-scripts log of about --mb megabytes to a temporary folder (the mix a
long run produces: tqdm bar updates joined by carriage returns, Rich records wrapped at 80
columns, epoch headers, saves, an occasional traceback and OOM), parses it the way
`kohya-tuner diagnose` does (chunk by chunk from disk) and prints lines/s, MB/s and peak RSS.

    python benchmarks/logparse_speed.py [--mb 100]
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
    """A log of about `megabytes` MB; returns the number of lines (\\n and \\r separated)."""
    target = int(megabytes * 1_000_000)
    total = 100_000
    lines = 0
    written = 0
    step = 0
    with open(path, "w", encoding="utf-8", newline="") as fh:
        while written < target:
            block = []
            for _ in range(40):
                step += 1
                pct = step * 100 // total
                filled = "█" * (pct // 10)
                for loss in ("", f", avr_loss=0.{step % 997:03d}"):
                    block.append(f"\rsteps: {pct:3d}%|{filled:<10}| {step}/{total} [1:02:03<2:03:04,  1.49s/it{loss}]")
            if step % 20_000 == 0:
                block.append("\n".join(_TRACEBACK) + "\n" + _OOM + "\n")
            block.append("\n\nepoch 3/40\n\n")
            block.append("\n".join(r.format(s=step) for r in _RICH) + "\n")
            text = "".join(block)
            fh.write(text)
            written += len(text.encode("utf-8"))
            lines += text.count("\n") + text.count("\r")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0, help="size of the synthetic log in MB (default 100)")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from kohya_tuner.logparse import Oom, Progress, diagnose
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

        t0 = time.perf_counter()
        c0 = time.process_time()
        diagnosis = diagnose(counted(iter_events(open_log(path))))
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    print(f"parsed + diagnosed in {elapsed:.2f} s: {lines / elapsed:,.0f} lines/s, {size / 1e6 / elapsed:.1f} MB/s")
    # On a shared machine the wall clock includes other processes' time; CPU time does not.
    print(f"CPU time {cpu:.2f} s: {lines / cpu:,.0f} lines/s, {size / 1e6 / cpu:.1f} MB/s of CPU")
    print(f"events: {counts['progress']:,} progress, {counts['oom']} oom, {counts['other']:,} other; "
          f"diagnosis: {diagnosis.outcome} / {diagnosis.phase} at step {diagnosis.step}")
    print(f"peak RSS: {peak:.0f} MiB (before parsing {rss_before:.0f} MiB; the log is {size / 2**20:.0f} MiB)")
    if os.environ.get("KT_BENCH_STRICT") and peak - rss_before > size / 2**20 / 4:
        raise SystemExit("parsing held a large part of the log in memory")


if __name__ == "__main__":
    main()
