"""Chunked prefill, merged by mla-gen: what an engine does when new tokens arrive for requests that
already have a context (a prefix in the KV cache).

For each request, attention of its new tokens is computed in two parts with torch's SDPA on the
flash backend, which also returns each row's log-sum-exp (natural log):

  prefix  the new tokens' queries over the request's context keys and values (no mask)
  suffix  the new tokens' queries over the new keys and values, causal

and `mla_gen.merge_attn_states` merges the two into attention over context + new tokens, which
must equal full causal attention within rounding. Some requests have no context: their prefix
does not exist, and the merge must take the suffix as is. Two ways to say so:

  mask       the requests' start locations (`query_start_loc`, `context_start_loc`): the fused
             empty-context mask (a `_ctxmask` kernel) reads their prefix lse as -inf; where the
             kernel folder has none, `mask_empty_context_lse` on the prefix lse, then the merge
  threshold  the requests with context first, then `prefill_tokens_with_context` = their token
             count: every later token copies the suffix

Run: python3 python/examples/chunked_prefill.py   (a CUDA GPU; the fused mask needs a folder with
`_ctxmask` kernels, e.g. MLA_GEN_KERNELS=DIR from `mla-gen generate tests/gpu-ctxmask.toml`)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import mla_gen

H, D = 16, 128
DTYPE = torch.bfloat16
# (context tokens, new tokens) per request: some without context, some with one new token.
REQUESTS = [(300, 64), (0, 40), (1000, 1), (17, 129), (0, 7), (2048, 256), (5, 33)]


def flash(q, k, v, causal):
    """SDPA on the flash backend: the output [L, H, D] and its lse [H, L] (natural log, float32)."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], 0.0, causal, False)[:2]
    return out[0].transpose(0, 1), lse[0]


def full_attention(q, k_ctx, v_ctx, k_new, v_new):
    """The reference: the new tokens over context + new keys, causal over the new ones, in float32."""
    c, n = k_ctx.shape[0], q.shape[0]
    k = torch.cat([k_ctx, k_new]).float().transpose(0, 1)
    v = torch.cat([v_ctx, v_new]).float().transpose(0, 1)
    mask = torch.ones(n, c + n, dtype=torch.bool, device=q.device).tril(diagonal=c)
    return F.scaled_dot_product_attention(q.float().transpose(0, 1), k, v, attn_mask=mask).transpose(0, 1)


def make(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, H, D, generator=g, device="cuda", dtype=DTYPE)  # noqa: E731
    return [(rnd(n), rnd(c), rnd(c), rnd(n), rnd(n)) for c, n in REQUESTS]  # q, k_ctx, v_ctx, k_new, v_new


def parts(reqs):
    """Per token of all requests: prefix output and lse (zeros and 0 where a request has no
    context: the merge must not read them), suffix output and lse, the full reference."""
    p_out, p_lse, s_out, s_lse, ref = [], [], [], [], []
    for q, k_ctx, v_ctx, k_new, v_new in reqs:
        o, l = flash(q, k_new, v_new, causal=True)
        s_out.append(o)
        s_lse.append(l)
        if k_ctx.shape[0]:
            o, l = flash(q, k_ctx, v_ctx, causal=False)
        else:  # no context: nothing to attend to (garbage the merge must ignore)
            o, l = torch.full_like(q, 7.0), torch.zeros(H, q.shape[0], device="cuda")
        p_out.append(o)
        p_lse.append(l)
        ref.append(full_attention(q, k_ctx, v_ctx, k_new, v_new))
    cat = lambda xs, dim=0: torch.cat(xs, dim).contiguous()  # noqa: E731
    return cat(p_out), cat(p_lse, 1), cat(s_out), cat(s_lse, 1), cat(ref)


def by_mask(reqs):
    """Merged with the requests' start locations: the fused mask, else the mask kernel first."""
    p_out, p_lse, s_out, s_lse, ref = parts(reqs)
    qsl = torch.tensor([0] + [n for _, n in REQUESTS], device="cuda").cumsum(0).int()
    csl = torch.tensor([0] + [c for c, _ in REQUESTS], device="cuda").cumsum(0).int()
    out = torch.empty_like(s_out)
    if mla_gen.supports(DTYPE, D, output_lse=True, threshold=True, mask_empty_context=True):
        how = "the fused mask"
        mla_gen.merge_attn_states(out, p_out, p_lse, s_out, s_lse, query_start_loc=qsl, context_start_loc=csl)
    else:
        how = "mask_empty_context_lse, then the merge"
        mla_gen.mask_empty_context_lse(p_lse, qsl, csl)
        mla_gen.merge_attn_states(out, p_out, p_lse, s_out, s_lse)
    return out, ref, how


def by_threshold(reqs):
    """Merged with the requests with context first and the threshold after their tokens."""
    order = sorted(range(len(reqs)), key=lambda b: REQUESTS[b][0] == 0)  # stable: with context first
    p_out, p_lse, s_out, s_lse, ref = parts([reqs[b] for b in order])
    n = sum(REQUESTS[b][1] for b in order if REQUESTS[b][0])
    out = torch.empty_like(s_out)
    mla_gen.merge_attn_states(out, p_out, p_lse, s_out, s_lse, prefill_tokens_with_context=n)
    return out, ref, f"the threshold (n = {n} of {out.shape[0]} tokens)"


def main() -> dict:
    """Both forms against full attention; returns each form's largest difference."""
    reqs = make()
    worst = {}
    for form in (by_mask, by_threshold):
        try:
            out, ref, how = form(reqs)
        except ValueError as e:  # a kernel folder without the kernels this form needs
            print(f"{form.__name__}: skipped ({e})")
            continue
        err = (out.float() - ref).abs().max().item()
        worst[form.__name__] = err
        # bf16 output: half an ulp of values up to ~4 is 2^-7; the two SDPA parts round too.
        assert err < 3e-2, f"{form.__name__} ({how}): differs from full attention by {err}"
        print(f"{form.__name__}: merged by {how}, {out.shape[0]} tokens x {H} heads x D {D}: "
              f"max |merged - full attention| = {err:.2e}")
    return worst


if __name__ == "__main__":
    main()
