"""Replay a trace's allocations through a model of PyTorch's CUDA caching allocator.

`torch.cuda.max_memory_allocated()` (what the tracer's peak is) counts live tensors; what
nvidia-smi or a task manager shows is the memory the allocator has *reserved* from the driver,
plus the CUDA context. The allocator keeps freed blocks for reuse and carves requests out of
larger segments, so reserved memory can exceed the live peak. This module replays the tracer's
allocation/free sequence through the allocator's documented policy (PyTorch's
CUDACachingAllocator, default settings, one stream):

* requests are rounded up to 512 bytes; up to 1 MiB they come from the small pool, larger ones
  from the large pool;
* a request is served from the smallest free cached block of its pool that fits (best fit);
  the rest of the block is split off when it is at least 512 bytes (small pool) or more than
  1 MiB (large pool);
* when no cached block fits, a new segment is reserved: 2 MiB for small requests, 20 MiB for
  requests under 10 MiB, otherwise the request rounded up to 2 MiB;
* a freed block merges with free neighbours of its segment; segments are returned to the driver
  only by empty_cache (not modelled inside a step).

Standard library only.
"""
from __future__ import annotations

import bisect

MIB = 1 << 20
SMALL = 1 * MIB
MIN_BLOCK = 512


def _round(n: int) -> int:
    return max(MIN_BLOCK, (n + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK)


def _segment_size(n: int) -> int:
    if n <= SMALL:
        return 2 * MIB
    if n < 10 * MIB:
        return 20 * MIB
    return (n + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)


class CachingAllocatorSim:
    def __init__(self):
        self.next_addr = 0
        # addr -> [size, segment_start, segment_end, free, pool]; ends: block end -> block start
        self.blocks: dict[int, list] = {}
        self.ends: dict[int, int] = {}
        self.free_sorted = {"small": [], "large": []}  # sorted (size, addr)
        self.owner: dict[object, int] = {}
        self.reserved = 0
        self.allocated = 0
        self.peak_reserved = 0
        self.peak_allocated = 0
        self.reserved_at_peak_allocated = 0

    def _set(self, addr: int, blk: list) -> None:
        self.blocks[addr] = blk
        self.ends[addr + blk[0]] = addr

    def _drop(self, addr: int) -> list:
        blk = self.blocks.pop(addr)
        if self.ends.get(addr + blk[0]) == addr:
            del self.ends[addr + blk[0]]
        return blk

    def _add_free(self, addr: int) -> None:
        b = self.blocks[addr]
        bisect.insort(self.free_sorted[b[4]], (b[0], addr))

    def _remove_free(self, addr: int) -> None:
        b = self.blocks[addr]
        lst = self.free_sorted[b[4]]
        i = bisect.bisect_left(lst, (b[0], addr))
        del lst[i]

    def alloc(self, key: object, nbytes: int) -> None:
        if nbytes <= 0:
            return
        size = _round(nbytes)
        pool = "small" if size <= SMALL else "large"
        lst = self.free_sorted[pool]
        i = bisect.bisect_left(lst, (size, -1))
        if i < len(lst):
            _, addr = lst[i]
            del lst[i]
        else:
            seg = _segment_size(size)
            addr = self.next_addr
            self.next_addr += seg
            self._set(addr, [seg, addr, addr + seg, True, pool])
            self.reserved += seg
        b = self._drop(addr)
        rest = b[0] - size
        if (pool == "small" and rest >= MIN_BLOCK) or (pool == "large" and rest > SMALL):
            self._set(addr + size, [rest, b[1], b[2], True, pool])
            self._add_free(addr + size)
            b[0] = size
        b[3] = False
        self._set(addr, b)
        self.owner[key] = addr
        self.allocated += b[0]
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
            self.reserved_at_peak_allocated = self.reserved
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, key: object) -> None:
        addr = self.owner.pop(key, None)
        if addr is None:
            return
        b = self._drop(addr)
        self.allocated -= b[0]
        b[3] = True
        nxt = addr + b[0]
        nb = self.blocks.get(nxt)
        if nxt < b[2] and nb is not None and nb[3]:
            self._remove_free(nxt)
            b[0] += self._drop(nxt)[0]
        prev = self.ends.get(addr) if addr != b[1] else None
        if prev is not None and self.blocks[prev][3]:
            self._remove_free(prev)
            pb = self._drop(prev)
            pb[0] += b[0]
            addr, b = prev, pb
        self._set(addr, b)
        self._add_free(addr)


def replay(events) -> dict:
    """events: ("a", key, nbytes) / ("f", key) in order. Returns peaks in bytes."""
    sim = CachingAllocatorSim()
    for ev in events:
        if ev[0] == "a":
            sim.alloc(ev[1], ev[2])
        else:
            sim.free(ev[1])
    return {"peak_allocated": sim.peak_allocated, "peak_reserved": sim.peak_reserved,
            "reserved_at_peak_allocated": sim.reserved_at_peak_allocated}
