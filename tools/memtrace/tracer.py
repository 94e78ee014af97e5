"""Allocation-lifetime tracker and saved-for-backward counter for fake/meta tensors.

LiveMem is a TorchDispatchMode that sees every aten op.  Each new output storage is registered with
its byte size; a weakref callback on the UntypedStorage (PyTorch keeps one Python object per
StorageImpl) subtracts it when the storage dies.  So `live` is exactly what a device without a caching
allocator would hold, and `peak` is the high-water mark (comparable to torch.cuda.max_memory_allocated()).

Tensors that the trainer would keep in host memory (cpu_offload_checkpointing) are moved out of the
device count with `to_host`.

SavedCounter is a saved_tensors_hooks pair that records every tensor autograd saves, deduplicated by
storage, excluding parameters/buffers (already counted as weights).
"""
from __future__ import annotations

import collections
import weakref

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

CUDA_BLOCK = 512  # the CUDA caching allocator rounds every request up to 512 bytes


def _round(n: int, q: int = CUDA_BLOCK) -> int:
    return ((n + q - 1) // q) * q if n else 0


class LiveMem(TorchDispatchMode):
    def __init__(self, log_events: bool = False):
        super().__init__()
        # ("a", uid, nbytes) / ("f", uid) in order, for allocsim.replay (the caching allocator)
        self.events: list | None = [] if log_events else None
        self._uid = 0
        # The peak of live bytes other than gradients (a full fine-tune with fused_backward_pass frees
        # each gradient as it is made, so this is its peak besides the weights).
        self.peak_nograd = 0
        self.live = 0
        self.live_rounded = 0
        self.peak = 0
        self.peak_rounded = 0
        self.phase = "setup"
        self.in_attn = 0
        self.by_cat = collections.Counter()
        self.peak_snapshot: dict = {}
        self.phase_peak = collections.Counter()
        self._refs: dict = {}  # id(storage) -> [weakref, nbytes, cat]
        self.n_ops = 0
        self.n_allocs = 0
        self.host_bytes = 0
        self.op_alloc_bytes = collections.Counter()

    def _cb(self, key):
        def cb(_ref):
            ent = self._refs.pop(key, None)
            if ent is None:
                return
            _, nb, cat = ent[:3]
            if self.events is not None and nb:
                self.events.append(("f", ent[3]))
            self.live -= nb
            self.live_rounded -= _round(nb)
            self.by_cat[cat] -= nb
        return cb

    def track(self, t, cat: str) -> None:
        if not isinstance(t, torch.Tensor):
            return
        try:
            st = t.untyped_storage()
        except Exception:
            return
        key = id(st)
        ent = self._refs.get(key)
        if ent is not None and ent[0]() is st:
            return
        nb = st.nbytes()
        self._uid += 1
        self._refs[key] = [weakref.ref(st, self._cb(key)), nb, cat, self._uid]
        if self.events is not None:
            self.events.append(("a", self._uid, nb))
        self.live += nb
        self.live_rounded += _round(nb)
        self.by_cat[cat] += nb
        self.n_allocs += 1
        if self.live > self.peak:
            self.peak = self.live
            self.peak_snapshot = dict(phase=self.phase, by_cat=dict(self.by_cat))
        if self.live_rounded > self.peak_rounded:
            self.peak_rounded = self.live_rounded
        if self.live > self.phase_peak[self.phase]:
            self.phase_peak[self.phase] = self.live
        nograd = self.live - self.by_cat.get("grad", 0)
        if nograd > self.peak_nograd:
            self.peak_nograd = nograd

    def to_host(self, t) -> None:
        """Stop counting a tensor the trainer keeps in host RAM (its storage stays tracked at 0 bytes)."""
        if not isinstance(t, torch.Tensor):
            return
        ent = self._refs.get(id(t.untyped_storage()))
        if ent is None or ent[1] == 0:
            return
        nb, cat = ent[1], ent[2]
        if self.events is not None:
            self.events.append(("f", ent[3]))
        self.live -= nb
        self.live_rounded -= _round(nb)
        self.by_cat[cat] -= nb
        self.host_bytes += nb
        ent[1] = 0

    def recategorize(self, t, cat: str) -> None:
        """Count a tracked tensor under another category from now on (a gradient once it is stored)."""
        try:
            ent = self._refs.get(id(t.untyped_storage()))
        except Exception:
            return
        if ent is None or ent[2] == cat:
            return
        self.by_cat[ent[2]] -= ent[1]
        self.by_cat[cat] += ent[1]
        ent[2] = cat

    def category_of(self, t):
        try:
            ent = self._refs.get(id(t.untyped_storage()))
        except Exception:
            return None
        return None if ent is None else ent[2]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.n_ops += 1
        if func is torch.ops.prim.device.default:
            return out
        cat = ("attn_" if self.in_attn else "") + self.phase
        before = self.live
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.track(t, cat)
        if self.live > before:
            self.op_alloc_bytes[str(func.overloadpacket.__name__)] += self.live - before
        return out


class SavedCounter:
    """saved_tensors_hooks that dedupe by storage and skip weights."""

    def __init__(self, exclude_tensors, tracker: LiveMem | None = None):
        self.exclude = WeakIdKeyDictionary()
        for t in exclude_tensors:
            self.exclude[t.untyped_storage()] = True
        self.seen = WeakIdKeyDictionary()
        self.bytes = 0
        self.by_dtype = collections.Counter()
        self.by_cat = collections.Counter()
        self.n = 0
        self.shapes = collections.Counter()
        self.tracker = tracker

    def pack(self, t):
        st = t.untyped_storage()
        if st in self.exclude or st in self.seen:
            return t
        self.seen[st] = True
        nb = st.nbytes()
        self.bytes += nb
        self.n += 1
        self.shapes[(tuple(t.shape), str(t.dtype))] += nb
        self.by_dtype[str(t.dtype).replace("torch.", "")] += nb
        if self.tracker is not None:
            self.by_cat[self.tracker.category_of(t) or "untracked"] += nb
        return t

    @staticmethod
    def unpack(t):
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def install_attn_flag(tracker: LiveMem, flash_on_meta: bool = False, calls: list | None = None):
    """Monkeypatch F.scaled_dot_product_attention so that ops issued inside it are labelled 'attn_*',
    optionally record (B, H, Lq, Lk, head_dim) of every call made in the first forward pass, and optionally
    route it to the flash-style aten op (on the meta device SDPA would otherwise always take the math path)."""
    orig = F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if calls is not None and tracker.phase == "fwd":
            calls.append((int(query.shape[0]), int(query.shape[1]), int(query.shape[-2]), int(key.shape[-2]),
                          int(query.shape[-1])))
        tracker.in_attn += 1
        try:
            if flash_on_meta and attn_mask is None:
                return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    query, key, value, dropout_p, is_causal, scale=scale
                )[0]
            return orig(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                        is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        finally:
            tracker.in_attn -= 1

    F.scaled_dot_product_attention = sdpa
    torch.nn.functional.scaled_dot_product_attention = sdpa
    return orig


class ShadowInts(TorchDispatchMode):
    """Keep a real copy beside every integer/boolean fake tensor whose inputs are all known.

    Some sd-scripts models read sequence lengths back from their masks (`.item()`, `.tolist()`,
    slicing by a 0-d tensor); fake tensors have no data, so those reads would fail.  Masks, ids and
    lengths are small and never float: this mode recomputes every op whose tensor inputs all have a
    real copy (factory ops have none) on the real copies, with every mode switched off so nothing is
    counted, and answers `_local_scalar_dense` (what `.item()`, `bool()` and `__index__` dispatch) and
    `tolist()` from the copy.  Float tensors stay fake: their values never decide a shape here.
    """

    LIMIT = 1 << 24

    def __init__(self):
        super().__init__()
        self.real = WeakIdKeyDictionary()
        self._orig_tolist = None

    @staticmethod
    def _is_fake(t) -> bool:
        from torch._subclasses.fake_tensor import FakeTensor
        return isinstance(t, FakeTensor)

    def _has(self, t) -> bool:
        # A real tensor (a constant such as the True of `mask[:n] = True`) is its own copy.
        return isinstance(t, torch.Tensor) and (not self._is_fake(t) or t in self.real)

    def _real(self, t):
        return self.real[t] if self._is_fake(t) else t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        from torch.utils._python_dispatch import _disable_current_modes
        if func is torch.ops.aten._local_scalar_dense.default and self._is_fake(args[0]) and args[0] in self.real:
            with _disable_current_modes():
                return self.real[args[0]].item()
        out = func(*args, **kwargs)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not outs or any(t.dtype.is_floating_point or t.dtype.is_complex or t.numel() > self.LIMIT for t in outs):
            return out
        flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if not all(self._has(t) for t in flat):
            return out
        from torch.utils._pytree import tree_map
        r_args, r_kwargs = tree_map(lambda t: self._real(t) if isinstance(t, torch.Tensor) else t, (args, kwargs))
        with _disable_current_modes():
            r_out = func(*r_args, **r_kwargs)
        for f, r in zip(tree_flatten(out)[0], tree_flatten(r_out)[0]):
            if isinstance(f, torch.Tensor) and isinstance(r, torch.Tensor):
                self.real[f] = r
        return out

    def __enter__(self):
        orig = torch.Tensor.tolist
        mode = self

        def tolist(t):
            if t in mode.real:
                from torch.utils._python_dispatch import _disable_current_modes
                with _disable_current_modes():
                    return mode.real[t].tolist()
            return orig(t)

        self._orig_tolist = orig
        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._orig_tolist
        return super().__exit__(*exc)
