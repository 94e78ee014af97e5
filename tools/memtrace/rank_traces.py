"""Trace the family's own LoRA module at two ranks, same size, to see what the rank adds to the activations:
a LoRA layer keeps its down-projection's output (rank values per token) for the up-projection's backward, so
the saved tensors grow with the rank while the traced activation lines are at one rank. The LoRA's gradients
are counted apart (--grads-apart): they grow with the rank too, but the estimate counts them on their own.
One JSON line per
trace in results/sdscripts_ranks.jsonl (run_trace.py's rows plus `network: "lora"` and `rank_sweep: true`);
fit_coefficients.py turns each pair into the estimator's `lora_rank_activations`.

    $KOHYA/venv/bin/python tools/memtrace/rank_traces.py --sdscripts $KOHYA/sd-scripts
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# (arch, res, checkpointing, the two ranks): the U-Nets at 8 and 64, FLUX at 16 and 128 (the ranks people use).
PAIRS = [("sd15", 512, False, (8, 64)), ("sd15", 512, True, (8, 64)), ("sdxl", 1024, False, (8, 64)),
         ("sdxl", 1024, True, (8, 64)), ("flux", 1024, True, (16, 128)), ("flux", 512, False, (16, 128))]


def run(arch: str, res: int, ckpt: bool, rank: int, checkout: str) -> dict:
    cmd = [sys.executable, os.path.join(HERE, "run_trace.py"), "--arch", arch, "--impl", "sd-scripts", "--sdscripts",
           checkout, "--res", str(res), "--batch", "1", "--rank", str(rank), "--grads-apart"] + (["--ckpt"] if ckpt else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        return {"job": [arch, res, ckpt, rank], "failed": (p.stderr or p.stdout)[-600:]}
    row = json.loads(lines[-1])
    row.update(network="lora", network_args="", rank_sweep=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdscripts", required=True)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "sdscripts_ranks.jsonl"))
    args = ap.parse_args(argv)
    checkout = os.path.abspath(args.sdscripts)
    with open(args.out, "w", encoding="utf-8") as fh:
        for arch, res, ckpt, ranks in PAIRS:
            for rank in ranks:
                row = run(arch, res, ckpt, rank, checkout)
                fh.write(json.dumps(row) + "\n")
                fh.flush()
                print(arch, res, ckpt, rank, row.get("peak_minus_weights_GiB", row.get("failed")), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
