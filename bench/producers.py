"""Hot time of the default kernels and FlashInfer's MergeState after three producers of their inputs,
in Python as peers.py measures (its Shape and hot_l2.hot_us): torch.add(src, 0, out=arena)
(peers.py's), arena.copy_(src) (a copy-engine memcpy node) and arena.add_(0) in place; and the
mla-gen inputs in an arena of their own with the lse first. Why peers.py's hot time of mla-gen's
kernel at 512 x 32 x 64 differs from bench/gpu/peer_harness.cu's (docs/HISTORY.md, session 11).

    MLA_GEN_KERNELS=generated python3 bench/producers.py DIR   (DIR: libpeers_fi.so and
    libpeers_vllm.so, built as bench/gpu/peers.sh run builds them)
"""
import statistics
import sys

import torch

sys.path.insert(0, "python")
sys.path.insert(0, "bench")
import mla_gen  # noqa: E402
import peers as P  # noqa: E402
from hot_l2 import Arena, hot_us  # noqa: E402

pe = P.Peers(sys.argv[1])
for T, H, D in ((512, 32, 64), (1024, 16, 64), (64, 16, 128), (512, 32, 128)):
    sh = P.Shape(T, H, D, torch.bfloat16, seed=1)
    ours = lambda: mla_gen.merge_attn_states(sh.out, sh.prefix, sh.plse_hm, sh.suffix, sh.slse_hm, sh.out_lse_hm)
    fi = lambda: pe.flashinfer(sh.prefix, sh.plse_b2, sh.suffix, sh.slse_b2, sh.out, sh.out_lse_tm)
    # our own arena: lse first, then values
    f32 = torch.float32
    a2 = Arena([((H, T), f32), ((H, T), f32), ((T, H, D), torch.bfloat16), ((T, H, D), torch.bfloat16)])
    for v, x in zip(a2.views, (sh.plse_hm, sh.slse_hm, sh.prefix, sh.suffix)):
        v.copy_(x)
    a2.seal()
    ours2 = lambda: mla_gen.merge_attn_states(sh.out, a2.views[2], a2.views[0], a2.views[3], a2.views[1], sh.out_lse_hm)
    memcpy = lambda: sh.inputs.arena.copy_(sh.inputs.src)
    fill = lambda: sh.inputs.arena.add_(0)  # rewrite in place: reads and writes the arena only
    for f in (ours, fi, ours2):
        f()
    torch.cuda.synchronize()
    res = {}
    for rnd in range(5):
        for name, prod, fn in (("ours/add", sh.inputs.producer, ours), ("fi/add", sh.inputs.producer, fi),
                               ("ours/memcpy", memcpy, ours), ("fi/memcpy", memcpy, fi),
                               ("ours/inplace", fill, ours), ("fi/inplace", fill, fi),
                               ("ours-lsefirst/add", a2.producer, ours2)):
            prod(); fn(); torch.cuda.synchronize()
            res.setdefault(name, []).append(hot_us(prod, fn, 20, 15)[0])
    print(f"{T}x{H}x{D}: " + "  ".join(f"{k} {statistics.median(v):.3f}" for k, v in res.items()), flush=True)
