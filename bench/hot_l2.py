"""Hot-L2, graph-replayed timing shared by the benchmarks (bench.py, bench_ctxmask.py), the same
method as `mla-gen bench --l2 hot` (src/host/bench/graph.rs):

  A graph holds R iterations of [producer, X], where the producer is one elementwise kernel (an
  int32 add of 0 from a pristine copy) that writes every input of X just before it, as the
  attention kernels before a merge would; a second graph holds R producers alone. Each graph is
  replayed (3 untimed, then `reps` timed with CUDA events, every replay enqueued before the first
  is waited for) and X's time is (median[producer, X] - median[producer]) / R.

`Arena` puts a set of tensors in one buffer so that one producer launch writes them all.
"""

from __future__ import annotations

import statistics

import torch

from bench_table import iterations  # noqa: F401  (re-exported: the benchmarks import it from here)

ALIGN = 256


def _up(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Arena:
    """Tensors of the given (shape, dtype) inside one int32 buffer (each at a 256-byte aligned
    offset), and a pristine source of the same size that `producer()` copies into it."""

    def __init__(self, specs, device="cuda"):
        offs = [0]
        for shape, dtype in specs:
            n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            offs.append(offs[-1] + _up(n))
        self.src = torch.empty(max(offs[-1], ALIGN) // 4, dtype=torch.int32, device=device)
        self.arena = torch.empty_like(self.src)
        raw = self.arena.view(torch.uint8)
        self.views = []
        for (shape, dtype), off in zip(specs, offs):
            n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            self.views.append(raw[off:off + n].view(dtype).view(shape))
        self.bytes = offs[-1]

    def seal(self):
        """The arena's current contents become what the producer writes, bit for bit."""
        self.src.copy_(self.arena)

    def producer(self):
        torch.add(self.src, 0, out=self.arena)


def graph_us(body, R, reps):
    """Median over `reps` replays of a graph holding R iterations of `body`, per iteration (us)."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(R):
            body()
    for _ in range(3):
        g.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        g.replay()
        ends[i].record()
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
    del g
    return ms * 1e3 / R


def hot_us(producer, fn, R, reps, producer_us=None):
    """X = fn right after `producer`: (X's time, the producer's time) per iteration, in us. Pass
    `producer_us` to reuse a producer time measured for the same producer and R. `fn` and
    `producer` must have run once before (kernels loaded, nothing compiled during capture)."""
    def body():
        producer()
        fn()
    pair = graph_us(body, R, reps)
    if producer_us is None:
        producer_us = graph_us(producer, R, reps)
    return pair - producer_us, producer_us
