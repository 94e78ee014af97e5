"""The script `doctor` runs inside the trainer's Python to look at torch and friends.

It is run as `python -c <this source> <json options>` in a child process, so a broken
CUDA install, a mismatched xformers or a bitsandbytes without kernels can crash or hang
only the child. It imports nothing from kohya-tuner (the trainer's environment may not
have it) and sticks to syntax old Pythons understand, so it can report a too-old one.
It prints one line, PROBE_MARK followed by JSON, after whatever noise libraries print.
"""

from __future__ import annotations

PROBE_MARK = "KOHYA_TUNER_PROBE_RESULT:"

PROBE_SOURCE = r'''
import contextlib, io, json, os, platform, sys, time, traceback, warnings
T0 = time.time()
opts = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
out = {"python_version": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable,
       "platform": platform.platform(), "errors": {}, "packages": {}, "notes": {}}

def last_line(exc):
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    return text[-1] if text else type(exc).__name__

@contextlib.contextmanager
def quiet(section):
    # Libraries print banners and warnings on import; keep them as notes instead.
    buf = io.StringIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            yield
    text = buf.getvalue().strip()
    msgs = [str(w.message) for w in caught]
    if text:
        msgs.append(text)
    if msgs:
        out["notes"][section] = "\n".join(m[:600] for m in msgs)[:2000]

try:
    from importlib import metadata
    for name in opts.get("packages", []) + ["torch", "accelerate", "xformers", "bitsandbytes"]:
        try:
            out["packages"][name] = metadata.version(name)
        except Exception:
            out["packages"][name] = None
except Exception as exc:
    out["errors"]["packages"] = last_line(exc)

import importlib.util as iu
torch = None
if iu.find_spec("torch") is not None:
    try:
        with quiet("torch"):
            import torch
        out["torch"] = torch.__version__
        out["torch_cuda"] = getattr(torch.version, "cuda", None)
        out["torch_hip"] = getattr(torch.version, "hip", None)
        with quiet("cuda"):
            out["cuda_available"] = bool(torch.cuda.is_available())
        if out["cuda_available"]:
            devs = []
            for i in range(torch.cuda.device_count()):
                cap = torch.cuda.get_device_capability(i)
                devs.append({"name": torch.cuda.get_device_name(i), "capability": list(cap)})
            out["devices"] = devs
            try:
                out["arch_list"] = list(torch.cuda.get_arch_list())
            except Exception as exc:
                out["errors"]["arch_list"] = last_line(exc)
            try:
                out["bf16"] = bool(torch.cuda.is_bf16_supported())
            except Exception as exc:
                out["errors"]["bf16"] = last_line(exc)
    except BaseException as exc:
        out["errors"]["torch"] = last_line(exc)
        torch = None

if iu.find_spec("accelerate") is not None:
    try:
        with quiet("accelerate"):
            import accelerate
        out["accelerate"] = accelerate.__version__
        try:
            from accelerate.commands.config.config_args import default_config_file
            out["accelerate_config_path"] = default_config_file
            if os.path.isfile(default_config_file):
                with open(default_config_file, encoding="utf-8") as fh:
                    text = fh.read()
                try:
                    import yaml
                    cfg = yaml.safe_load(text)
                except Exception:
                    cfg = json.loads(text)
                out["accelerate_config"] = cfg if isinstance(cfg, dict) else {}
        except Exception as exc:
            out["errors"]["accelerate_config"] = last_line(exc)
    except BaseException as exc:
        out["errors"]["accelerate"] = last_line(exc)

if iu.find_spec("xformers") is not None:
    try:
        with quiet("xformers"):
            import xformers
            out["xformers"] = getattr(xformers, "__version__", "?")
            has_cpp = getattr(xformers, "_has_cpp_library", None)
            out["xformers_cpp"] = has_cpp
            try:
                from xformers import _cpp_lib
                meta = getattr(_cpp_lib, "_build_metadata", None)
                if meta is not None:
                    out["xformers_built_for"] = {"torch": getattr(meta, "torch_version", None),
                                                 "cuda": getattr(meta, "cuda_version", None)}
            except Exception:
                pass
            import xformers.ops
            if torch is not None and out.get("cuda_available"):
                q = torch.zeros(1, 8, 1, 64, device="cuda", dtype=torch.float16)
                xformers.ops.memory_efficient_attention(q, q, q)
                torch.cuda.synchronize()
                out["xformers_ran"] = True
    except BaseException as exc:
        out["errors"]["xformers"] = last_line(exc)

if iu.find_spec("bitsandbytes") is not None:
    try:
        with quiet("bitsandbytes"):
            import bitsandbytes as bnb
            out["bitsandbytes"] = getattr(bnb, "__version__", "?")
            if torch is not None and out.get("cuda_available") and opts.get("test_kernels", True):
                p = torch.nn.Parameter(torch.ones(4096, device="cuda"))
                opt = bnb.optim.AdamW8bit([p], lr=1e-3)
                p.grad = torch.ones_like(p)
                opt.step()
                torch.cuda.synchronize()
                out["bitsandbytes_ran"] = True
    except BaseException as exc:
        out["errors"]["bitsandbytes"] = last_line(exc)

out["elapsed_s"] = round(time.time() - T0, 3)
sys.stdout.flush()
sys.stdout.write("\n" + "KOHYA_TUNER_PROBE_RESULT:" + json.dumps(out, default=str) + "\n")
sys.stdout.flush()
'''
