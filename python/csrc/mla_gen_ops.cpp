// torch.ops.mla_gen.* on the LibTorch stable ABI (torch >= 2.10): one binary, _C.abi3.so, serves
// every later torch. The schemas are defined in Python (mla_gen/ops.py, with the fakes); this file
// registers the CUDA implementation of every op of the table (op_core.h has the work): a boxed
// function per op that reads the tensor handles, integers and options off the stable stack.
// Where the wheel also has a native build for the running torch (mla_gen_ops_native.cpp),
// mla_gen._ext loads that one instead: the stable ABI boxes each argument on the heap.

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/stableivalue_conversions.h>

#include "op_core.h"

namespace {

void read(AtenTensorHandle t, View& v) {
    void* data = nullptr;
    int64_t dim = 0, *sizes = nullptr, *strides = nullptr;
    int32_t dtype = 0, device_type = 0, device = 0;
    ok(aoti_torch_get_dim(t, &dim), "aoti_torch_get_dim");
    ok(aoti_torch_get_sizes(t, &sizes), "aoti_torch_get_sizes");
    ok(aoti_torch_get_strides(t, &strides), "aoti_torch_get_strides");
    ok(aoti_torch_get_dtype(t, &dtype), "aoti_torch_get_dtype");
    ok(aoti_torch_get_device_type(t, &device_type), "aoti_torch_get_device_type");
    ok(aoti_torch_get_device_index(t, &device), "aoti_torch_get_device_index");
    ok(aoti_torch_get_data_ptr(t, &data), "aoti_torch_get_data_ptr");
    v.set(t, dim, sizes, strides, dtype, device_type, device, data);
}

// The stable stack of one call: every optional argument unboxed (its box, torch's allocation, is
// ours to free), every tensor and string handle owned, before anything can fail, so that none
// leaks.
class StableFront {
   public:
    StableFront(const OpRow& op, StableIValue* stack) : stack_(stack) {
        for (int i = 0; i < op.n_args; ++i) {
            value_[i] = stack[i];
            given_[i] = true;
            if (op.args[i].optional) {
                StableIValue* box = torch::stable::detail::to<StableIValue*>(stack[i]);
                given_[i] = box != nullptr;
                if (box) {
                    value_[i] = *box;
                    delete box;
                }
            }
            if (op.args[i].role == 0 && given_[i]) own_[n_own_++] = handle(i);
            if (op.args[i].is_str && given_[i]) text_[i] = torch::stable::detail::to<StringHandle>(value_[i]);
        }
    }
    ~StableFront() {
        for (int i = 0; i < n_own_; ++i)
            if (own_[i]) aoti_torch_delete_tensor_object(own_[i]);
        for (StringHandle s : text_)
            if (s) torch_delete_string(s);
    }
    bool given(int i) const { return given_[i]; }
    void tensor(int i, View& v) const { read(handle(i), v); }
    int64_t integer(int i) const { return torch::stable::detail::to<int64_t>(value_[i]); }
    bool flag(int i) const { return torch::stable::detail::to<bool>(value_[i]); }
    std::string text(int i) const {
        const char* chars = nullptr;
        size_t len = 0;
        torch_string_c_str(text_[i], &chars);
        torch_string_length(text_[i], &len);
        return std::string(chars, len);
    }
    View allocate(int j, int64_t dim, const int64_t* sizes, const int64_t* strides, int32_t dtype, int32_t device_type,
                  int32_t device) {
        ok(aoti_torch_empty_strided(dim, sizes, strides, dtype, device_type, device, &out_[j]),
           "aoti_torch_empty_strided");
        own_[n_own_++] = out_[j];
        View v;
        read(out_[j], v);
        return v;
    }
    void returned(int n_out) {  // the outputs on the stack: no longer ours to delete
        for (int j = 0; j < n_out; ++j) {
            stack_[j] = torch::stable::detail::from(out_[j]);
            for (int i = 0; i < n_own_; ++i)
                if (own_[i] == out_[j]) own_[i] = nullptr;
        }
    }

   private:
    AtenTensorHandle handle(int i) const { return torch::stable::detail::to<AtenTensorHandle>(value_[i]); }
    StableIValue* stack_;
    StableIValue value_[kMaxArgs];
    bool given_[kMaxArgs] = {};
    AtenTensorHandle own_[kMaxTensors + 2] = {};
    int n_own_ = 0;
    AtenTensorHandle out_[2] = {};
    StringHandle text_[kMaxArgs] = {};
};

template <int O>
void boxed(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
    const OpRow& op = kOps[O];
    if (num_args != (uint64_t)op.n_args || num_outputs != (uint64_t)op.n_allocated)
        fail(std::string("mla_gen: ") + op.name + " was registered with another schema");
    StableFront in(op, stack);
    serve<O>(in);
}

using Boxed = void (*)(StableIValue*, uint64_t, uint64_t);
template <size_t... I>
constexpr std::array<Boxed, sizeof...(I)> boxed_table(std::index_sequence<I...>) {
    return {&boxed<(int)I>...};
}
constexpr auto kBoxed = boxed_table(std::make_index_sequence<kNumOps>{});  // one per op of the table

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(mla_gen, CUDA, m) {
    use_the_package_images();
    for (int i = 0; i < kNumOps; ++i) m.impl(kOps[i].name, kBoxed[i]);
}

STABLE_TORCH_LIBRARY_IMPL(mla_gen, CPU, m) {
    if (cpu_tests_wanted())
        for (int i = 0; i < kNumOps; ++i) m.impl(kOps[i].name, kBoxed[i]);
}
