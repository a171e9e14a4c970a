"""Copies of templates/ with the K-way kernel stripped or changed, one idea each, for timing
beside the shipped kernels (bench/gpu/kway.sh build with KWAY_VARIANTS; issue #34 item 4, the
hot losses at 2-5 us merges). Measurement only: `i32` is wrong past 2^31 elements, `noplace`
drops the last-first order of large merges. (`tilefirst`, session 26's renumbering of grids the
GPU holds at once, and `cheapfirst`, session 27's branch-free form of it, are in the template
since; `onehead` went with the guard it skipped; `swapgrid`, head blocks in grid x, was noise
once buffers were timed in several placements, session 28; their edits are in git history.)

  noplace  no block placement: launch order (place_merge_block's renumbering and tests gone)
  i32      32-bit index and offset arithmetic (FlashInfer's), not 64-bit (the prelude's
           place_tile_first keeps its 64-bit launch index)
  plain    row loads with ld.global, not ld.global.nc (FlashInfer's compile has .nc loads too:
           LDG.E.128.CONSTANT; a control for the load path)
  ftz      weights from ex2.approx.ftz (FlashInfer's fast math), without the subnormal fix-up
  seq      runtime K one state at a time, each state's loads after the last one's use
           (FlashInfer's loop: at K = 2 two dependent round trips, fewer loads in
           flight); compare its runtime-K kernel, not the fixed-K ones
  nolast   tile-first for every grid, never last-first (the large merges' order)
  lastcap  last-first only up to 1 GiB of states, launch order above (session 28: equal to the
           shipped order by name; the large cold losses were the call path's timing)
  b256h8   schedule keys, not a template: 256-thread blocks of 8 heads (D = 256: one token's
           8 heads a block, not 4; the spec's other head sizes change too)
  b1024h32 1024-thread blocks of 32 heads (D = 256: FlashInfer's block, one token's 32 heads)

The in-place merge's ideas (KWAY_INPLACE_VARIANTS; its schedule keys are the ones above and these):

  warpsync __syncwarp, not __syncthreads, between the lse reads and lane 0's lse write where a
           row's threads lie in one warp (FlashInfer's MergeStateInPlace has no barrier there)
  nosync   no barrier at all (FlashInfer's: measurement only, the lse read and write of a row
           are then ordered by nothing but the warp's lockstep)
  ncstate  the state's rows read with ld.global.nc like the other's (each element is read once,
           then written by the same thread); not a template for the default without a proof
  ipplain  launch order: no tile-first renumbering, no last-first (measurement only, the large
           merges lose the order)
  ip32     32-bit index and offset arithmetic (FlashInfer's; measurement only: wrong past 2^31)
  iptile   tile-first, never last-first (`iplast`, session 29's last-first rule, is the template's
           since session 30; `iphb1`, the shift and mask skipped for one head block, was no
           gain, run 177: in git history)
  iplo     launch order and the last-first test (what a grid with head blocks in x and token
           tiles in y would cost: tile-first for free, last-first a select); measurement only
  ipptr    the state row's and lse's addresses kept from the loads for the stores (phase 2 no longer
           recomputes them from t and h): 4.5% fewer instructions executed, no faster (run 185)
  ipflat   flat rows: block b (x fastest) takes rows b * rows_per_block.. of the T x H rows in
           token-major order, t = row / H, h = row % H, so at D = 64 a block of 16 rows at 32
           heads is one token's 16 heads (contiguous in a dense state), not 2 tokens x 8 heads (two
           pieces 4 KB apart); launch order, last-first above 20 MiB as the template. The grid is the template's (it holds
           at least T x H rows), so no host changes. Measurement only: 32-bit rows (T x H < 2^32)
           and a division a row (session 41: the 32-head cold loss on the H200)
  b256h16  256-thread blocks of 16 heads
  b256h32  256-thread blocks of 32 heads (D = 64: FlashInfer's block at 32 heads, a token's heads)
  b512h32  512-thread blocks of 32 heads (D = 128: FlashInfer's block at 32 heads, a token's heads)
  b512h16  512-thread blocks of 16 heads
  r2       two rows per thread (tokens apart by the block's tokens)

A name joins ideas with `+` (`noplace+i32`), applied left to right.

  python3 bench/kway_variants.py NAME SRC DST SPEC   # SRC: templates/, DST: the new folder,
                                                     # SPEC: the spec, written as DST/spec.toml
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

KWAY = "merge_states.cu.tera"
PRELUDE = "prelude.cu.tera"
INPLACE = "merge_state_in_place.cu.tera"
BARRIER = "    __syncthreads();\n\n    // Phase 2"


def replace(text: str, old: str, new: str, what: str) -> str:
    """`old` -> `new`, which must occur: a template that changed says so instead of going unedited."""
    if old not in text:
        sys.exit(f"kway_variants.py: {what}: {old[:60]!r} is no longer in the template; update this edit")
    return text.replace(old, new)


def noplace(files):
    s, n = re.subn(r"(void place_merge_block\([^)]*\) \{\n).*?\n\}\n",
                   r"\1    tile = blockIdx.x;\n    head_block = blockIdx.y;\n}\n", files[KWAY], count=1, flags=re.S)
    if n != 1:
        sys.exit("kway_variants.py: noplace: place_merge_block is no longer where this edit looks")
    files[KWAY] = s


def i32(files):
    head, sep, body = files[KWAY].partition('extern "C" __global__')
    head = head.replace("long long", "int")
    body = body.replace("long long", "int")
    for name in ("states_token_stride", "states_head_stride", "output_token_stride", "output_head_stride",
                 "num_heads"):
        body = re.sub(r"\* " + name + r"\b", f"* static_cast<int>({name})", body)
    body = replace(body, "(num_tokens - t + TOKENS_PER_BLOCK - 1) / TOKENS_PER_BLOCK)",
                   "static_cast<int>((num_tokens - t + TOKENS_PER_BLOCK - 1) / TOKENS_PER_BLOCK))", "i32")
    body = re.sub(r"(merge_rows<[^>]+>\(row_of, valid, )num_heads, states_state_stride",
                  r"\1static_cast<int>(num_heads), static_cast<int>(states_state_stride)", body)
    files[KWAY] = head + sep + body


def plain(files):
    files[PRELUDE] = replace(files[PRELUDE], 'asm("ld.global.nc.', 'asm("ld.global.', "plain")


def ftz(files):
    files[KWAY] = replace(files[KWAY], 'asm("ex2.approx.f32 %0, %1;"', 'asm("ex2.approx.ftz.f32 %0, %1;"', "ftz")


def seq(files):
    s = replace(files[KWAY], "{%- set kway_unrolled = 8 -%}", "{%- set kway_unrolled = 1 -%}", "seq")
    files[KWAY] = replace(s, "{%- set kway_chunk = 4 -%}", "{%- set kway_chunk = 1 -%}", "seq")


def nolast(files):
    files[KWAY] = re.sub(r"\n\{%- if runtime_k %\}\n    if \(blocks \* K > LAST_FIRST_ABOVE_BLOCK_STATES\).*?\{%- endif %\}",
                         "", files[KWAY], count=1, flags=re.S)
    if "tiles - 1 - tile" in files[KWAY]:
        sys.exit("kway_variants.py: nolast: the last-first lines are no longer where this edit looks")


def lastcap(files):
    """Last-first only for states of at most 1 GiB (LAST_FIRST_SPAN above the 20 MiB bound): above, launch order."""
    s = files[KWAY]
    s = replace(s, "constexpr unsigned int LAST_FIRST_ABOVE_BLOCK_STATES = LAST_FIRST_ABOVE_BYTES / BLOCK_INPUT_BYTES;\n",
                "constexpr unsigned int LAST_FIRST_ABOVE_BLOCK_STATES = LAST_FIRST_ABOVE_BYTES / BLOCK_INPUT_BYTES;\n"
                "constexpr unsigned int LAST_FIRST_SPAN = (1ull << 30) / BLOCK_INPUT_BYTES - LAST_FIRST_ABOVE_BLOCK_STATES;\n",
                "lastcap")
    s = replace(s, "if (blocks * K > LAST_FIRST_ABOVE_BLOCK_STATES) tile",
                "if (blocks * K - (LAST_FIRST_ABOVE_BLOCK_STATES + 1) < LAST_FIRST_SPAN) tile", "lastcap")
    s = replace(s, "if (blocks > LAST_FIRST_ABOVE_BLOCK_STATES / NUM_STATES) tile",
                "if (blocks - (LAST_FIRST_ABOVE_BLOCK_STATES / NUM_STATES + 1) < LAST_FIRST_SPAN / NUM_STATES) tile",
                "lastcap")
    files[KWAY] = s


def warpsync(files):
    files[INPLACE] = replace(files[INPLACE], BARRIER, "{%- if launch.threads_per_row <= 32 and 32 % "
                             "launch.threads_per_row == 0 %}\n    __syncwarp();\n{%- else %}\n"
                             "    __syncthreads();\n{%- endif %}\n\n    // Phase 2", "warpsync")


def nosync(files):
    files[INPLACE] = replace(files[INPLACE], BARRIER, "\n    // Phase 2", "nosync")


def ncstate(files):
    files[INPLACE] = replace(files[INPLACE], "mine[r][k] = load_pack_rw(", "mine[r][k] = load_pack(", "ncstate")


def ipplain(files):
    files[INPLACE] = replace(files[INPLACE], "place_in_place_block(tile, head_block);",
                             "tile = blockIdx.x; head_block = blockIdx.y;", "ipplain")


def ip32(files):
    head, sep, body = files[INPLACE].partition('extern "C" __global__')
    body = replace(body, "long long", "int", "ip32")
    for name in ("state_token_stride", "state_head_stride", "other_token_stride", "other_head_stride",
                 "num_heads", "num_tokens"):
        body = re.sub(r"([*<,(] )" + name + r"\b", r"\1static_cast<int>(" + name + ")", body)
    files[INPLACE] = head + sep + body


def iptile(files):
    files[INPLACE] = replace(files[INPLACE], "    if (tiles * head_blocks > LAST_FIRST_ABOVE_BLOCKS) tile = tiles - 1 - tile;\n",
                             "", "iptile")


def iplo(files):
    files[INPLACE] = replace(files[INPLACE], "    place_tile_first(tiles, head_blocks, tile, head_block);\n",
                             "    tile = blockIdx.x;\n    head_block = blockIdx.y;\n", "iplo")


def ipptr(files):
    s = replace(files[INPLACE], "    bool merge[ROWS_PER_THREAD];\n",
                "    bool merge[ROWS_PER_THREAD];\n    elem_t* state_rows[ROWS_PER_THREAD];\n"
                "    float* lse_out[ROWS_PER_THREAD];\n", "ipptr")
    s = replace(s, "        const elem_t* state_row = state + t * state_token_stride + h * state_head_stride;\n",
                "        elem_t* state_row = state + t * state_token_stride + h * state_head_stride;\n"
                "        state_rows[r] = state_row;\n        lse_out[r] = state_lse + lse_at;\n", "ipptr")
    s = replace(s, "        const long long t = first_token + r * TOKENS_PER_BLOCK;\n"
                "        elem_t* state_row = state + t * state_token_stride + h * state_head_stride;\n"
                "        const long long lse_at = lse_index(t, h, num_tokens, num_heads);\n",
                "        elem_t* state_row = state_rows[r];\n", "ipptr")
    s = replace(s, "state_lse[lse_at] = -INF;", "*lse_out[r] = -INF;", "ipptr")
    files[INPLACE] = replace(s, "state_lse[lse_at] = w.lse();", "*lse_out[r] = w.lse();", "ipptr")


def ipflat(files):
    s = replace(files[INPLACE], """    unsigned int tile, head_block;
    place_in_place_block(tile, head_block);
    const long long h = static_cast<long long>(head_block) * HEADS_PER_BLOCK + group % HEADS_PER_BLOCK;
    const long long first_token = static_cast<long long>(tile) * (TOKENS_PER_BLOCK * ROWS_PER_THREAD) +
                                  group / HEADS_PER_BLOCK;
""", """    const unsigned int blocks = gridDim.x * gridDim.y;
    unsigned int b = blockIdx.y * gridDim.x + blockIdx.x;
    if (blocks > LAST_FIRST_ABOVE_BLOCKS) b = blocks - 1 - b;
    constexpr unsigned int ROWS_A_PASS = TOKENS_PER_BLOCK * HEADS_PER_BLOCK;
    long long ts[ROWS_PER_THREAD], hs[ROWS_PER_THREAD];
#pragma unroll
    for (int r = 0; r < ROWS_PER_THREAD; ++r) {
        const unsigned int row = b * (ROWS_A_PASS * ROWS_PER_THREAD) + r * ROWS_A_PASS + group;
        ts[r] = row / static_cast<unsigned int>(num_heads);
        hs[r] = row % static_cast<unsigned int>(num_heads);
    }
""", "ipflat")
    s = s.replace("        const long long t = first_token + r * TOKENS_PER_BLOCK;\n",
                  "        const long long t = ts[r], h = hs[r];\n")
    if "first_token" in s:
        sys.exit("ipflat: the template's rows are not where the edit expects them")
    files[INPLACE] = s


IDEAS = {"noplace": noplace, "i32": i32, "plain": plain, "ftz": ftz, "seq": seq, "nolast": nolast,
         "lastcap": lastcap, "warpsync": warpsync, "nosync": nosync, "ncstate": ncstate,
         "ipplain": ipplain, "ip32": ip32, "iptile": iptile, "iplo": iplo, "ipptr": ipptr,
         "ipflat": ipflat}
# Schedule keys appended to the spec (docs/SPEC.md, "Schedule"): the kernels' shape, not their code.
SCHEDULES = {"b256h8": "block_threads = 256\nheads_per_block = 8\n",
             "b1024h32": "block_threads = 1024\nheads_per_block = 32\n",
             "b256h16": "block_threads = 256\nheads_per_block = 16\n",
             "b256h32": "block_threads = 256\nheads_per_block = 32\n",
             "b512h32": "block_threads = 512\nheads_per_block = 32\n",
             "b512h16": "block_threads = 512\nheads_per_block = 16\n",
             "r2": "rows_per_thread = 2\n"}


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    name, src, dst, spec = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    unknown = [i for i in name.split("+") if i not in IDEAS and i not in SCHEDULES]
    if unknown:
        sys.exit(f"kway_variants.py: unknown idea {unknown[0]!r}; known: {', '.join([*IDEAS, *SCHEDULES])}")
    files = {f: (src / f).read_text() for f in (KWAY, PRELUDE, INPLACE)}
    spec_text = spec.read_text()
    for idea in name.split("+"):
        if idea in SCHEDULES:
            spec_text += SCHEDULES[idea]  # the spec's one table takes them
        else:
            IDEAS[idea](files)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    for f, text in files.items():
        (dst / f).write_text(text)
    (dst / "spec.toml").write_text(spec_text)


if __name__ == "__main__":
    main()
