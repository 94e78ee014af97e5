"""Trace the network modules other than the families' LoRA: every LyCORIS algorithm kohya-tuner counts
(`lycoris.kohya`, from a pinned `lycoris-lora` on PYTHONPATH) and sd-scripts' `networks.oft`, each on
sd-scripts' own U-Net with the family's LoRA traced beside it at the same sizes, gradient checkpointing
on and off. One JSON line per trace in results/sdscripts_networks.jsonl (run_trace.py's rows plus
`network` / `network_args`); fit_networks.py turns them into the estimator's table.

    PYTHONPATH=/tmp/lyco $KOHYA/venv/bin/python tools/memtrace/network_traces.py --sdscripts $KOHYA/sd-scripts -j 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = 8
# (module, network_args); None: the family's own LoRA module, the baseline.
NETWORKS = [(None, "")] + [("lycoris.kohya", f"algo={a}") for a in
                           ("locon", "loha", "lokr", "ia3", "dylora", "glora", "diag-oft", "boft")] + [
    ("networks.oft", "")]
# BOFT needs an even block of 10 for the U-Nets' 320/640/1280 widths: rank 16 (see lycoris_targets.py).
RANK_OF = {"algo=boft": 16}
# (arch, res, batch) in the order they are traced: one size per family first, then a second for SD 1.5
# to see what grows with the tokens.
SIZES = [("sd15", 512, 1), ("sdxl", 1024, 1), ("sd15", 768, 1)]


def jobs(archs, sizes=SIZES, ckpts=(True, False), nets=None):
    for arch, res, batch in sizes:
        if arch not in archs:
            continue
        for ckpt in ckpts:
            for module, nargs in NETWORKS:
                if nets is None or (nargs.split("=")[-1] if module else "lora") in nets or module in nets:
                    yield arch, res, batch, ckpt, module, nargs


def run(job, checkout):
    arch, res, batch, ckpt, module, nargs = job
    cmd = [sys.executable, os.path.join(HERE, "run_trace.py"), "--arch", arch, "--impl", "sd-scripts", "--sdscripts",
           checkout, "--res", str(res), "--batch", str(batch), "--rank", str(RANK_OF.get(nargs, RANK))]
    if ckpt:
        cmd.append("--ckpt")
    if module:
        cmd += ["--network", module, "--network-args", nargs]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        return {"job": list(job), "failed": (p.stderr or p.stdout)[-600:]}
    row = json.loads(lines[-1])
    row["network"] = module or "lora"
    row["network_args"] = nargs
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdscripts", required=True)
    ap.add_argument("--archs", default="sd15,sdxl")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "sdscripts_networks.jsonl"))
    ap.add_argument("-j", type=int, default=1)
    ap.add_argument("--sizes", default=None, help="arch:res:batch,... instead of the built-in order")
    ap.add_argument("--ckpt", choices=["both", "on", "off"], default="both")
    ap.add_argument("--nets", default=None, help="only these: lora, an algo name, or a module (comma-separated)")
    args = ap.parse_args(argv)
    checkout = os.path.abspath(args.sdscripts)
    done = set()
    if os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as fh:
            for line in fh:
                r = json.loads(line)
                if "failed" not in r and "error" not in r:
                    done.add((r["arch"], r["res"], r["batch"], r["ckpt"], None if r["network"] == "lora"
                              else r["network"], r["network_args"]))
    sizes = SIZES if not args.sizes else [(a, int(r), int(b)) for a, r, b in
                                          (x.split(":") for x in args.sizes.split(","))]
    ckpts = {"both": (True, False), "on": (True,), "off": (False,)}[args.ckpt]
    nets = set(args.nets.split(",")) if args.nets else None
    todo = [j for j in jobs(args.archs.split(","), sizes, ckpts, nets) if j not in done]
    # Rows land as they come (appended), so a long run that is cut short keeps what it traced.
    with open(args.out, "a", encoding="utf-8") as fh, ThreadPoolExecutor(args.j) as pool:
        for row in pool.map(lambda j: run(j, checkout), todo):
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            print(row.get("arch", row.get("job")), row.get("network"), row.get("network_args"), row.get("ckpt"),
                  row.get("res"), row.get("peak_GiB", row.get("failed")), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
