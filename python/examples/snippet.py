import torch
from mla_gen import merge_attn_states, stats  # pip install ./python

T, H, D = 1024, 16, 128
prefix, suffix = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
prefix_lse, suffix_lse = (torch.randn(H, T, device="cuda") for _ in range(2))
out = torch.empty_like(prefix)
merge_attn_states(out, prefix, prefix_lse, suffix, suffix_lse, prefill_tokens_with_context=600)  # loads its module
loads = stats()["module_loads"]
for n in (700, 701, 900):  # a new threshold is an argument: no compile, no module load
    merge_attn_states(out, prefix, prefix_lse, suffix, suffix_lse, prefill_tokens_with_context=n)
assert stats()["module_loads"] == loads
