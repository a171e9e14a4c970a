// A floor for the compiled op's host cost: torch.ops.mla_gen_bench_floor.merge_attn_states, an op
// of the compiled op's schema on the same LibTorch stable ABI (a boxed function) that takes
// ownership of its arguments as the compiled op does (each tensor handle and each optional given
// is the function's to free) and does nothing else. What the dispatcher and the stable ABI's
// boxing cost any such op; the compiled op's own work is its time above this one. The schema is
// defined in Python before this library loads (bench/host_cost.py and host_cost_stub.py
// build and load it); nothing here ships.

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/stableivalue_conversions.h>

#include <cstdint>

namespace {

void free_tensor(StableIValue v) {
    AtenTensorHandle h = torch::stable::detail::to<AtenTensorHandle>(v);
    if (h) aoti_torch_delete_tensor_object(h);
}

// An optional argument: a pointer to a StableIValue (allocated by torch), or null.
StableIValue* optional_at(StableIValue v) { return torch::stable::detail::to<StableIValue*>(v); }

void nothing_boxed(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
    (void)num_args;
    (void)num_outputs;
    for (int i : {0, 2, 3, 4, 5}) free_tensor(stack[i]);
    for (int i : {1, 6, 7, 8, 9}) {
        StableIValue* p = optional_at(stack[i]);
        if (!p) continue;
        if (i != 6) free_tensor(*p);
        delete p;
    }
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(mla_gen_bench_floor, CUDA, m) { m.impl("merge_attn_states", &nothing_boxed); }
STABLE_TORCH_LIBRARY_IMPL(mla_gen_bench_floor, CPU, m) { m.impl("merge_attn_states", &nothing_boxed); }
