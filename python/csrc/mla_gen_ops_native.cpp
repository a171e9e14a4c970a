// torch.ops.mla_gen.* as TORCH_LIBRARY kernels built for one torch release (python/setup.py:
// _C_torch<major>_<minor>.abi3.so, against that release's headers and libraries). mla_gen._ext
// loads it only under a final release of that major.minor, else the stable-ABI build
// (mla_gen_ops.cpp). Both register
// the same table's ops with the same work (op_core.h); this one reads the dispatcher's stack of
// IValues in place, where the stable ABI copies each tensor handle and boxes each optional
// argument on the heap (0.55-0.75 us a call on the H200, docs/PERFORMANCE.md's host cost).

#include <ATen/ops/empty_strided.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/library.h>

#include "op_core.h"

// libstdc++ (GCC >= 11, on glibc >= 2.32) skips atomic reference counts where glibc's
// __libc_single_threaded says the process has one thread; that symbol (GLIBC_2.32) would make the
// wheel manylinux_2_34. This library's own copy, hidden and 0 ("threads may exist"), keeps every
// count atomic and the wheel at torch's glibc floor.
extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
}

namespace {

// The dispatcher's stack of one call: its arguments are its last n IValues, which the stack keeps
// alive for the whole call; the outputs replace them.
class NativeFront {
   public:
    NativeFront(const OpRow& op, const c10::FunctionSchema& schema, torch::jit::Stack* stack)
        : stack_(stack), n_(op.n_args) {
        if (schema.arguments().size() != (size_t)n_ || schema.returns().size() != (size_t)op.n_allocated ||
            stack->size() < (size_t)n_)
            fail(std::string("mla_gen: ") + op.name + " was registered with another schema");
        args_ = stack->data() + (stack->size() - n_);
    }
    bool given(int i) const { return !args_[i].isNone(); }
    void tensor(int i, View& v) const { read(args_[i].toTensor(), v); }
    int64_t integer(int i) const {
        const c10::IValue& x = args_[i];
        return x.isInt() ? x.toInt() : x.toSymInt().guard_int(__FILE__, __LINE__);
    }
    bool flag(int i) const { return args_[i].toBool(); }
    std::string text(int i) const { return args_[i].toStringRef(); }
    View allocate(int j, int64_t dim, const int64_t* sizes, const int64_t* strides, int32_t dtype, int32_t device_type,
                  int32_t device) {
        out_[j] = at::empty_strided(c10::IntArrayRef(sizes, dim), c10::IntArrayRef(strides, dim),
                                    at::TensorOptions()
                                        .dtype((c10::ScalarType)dtype)
                                        .device(c10::Device((c10::DeviceType)device_type, (c10::DeviceIndex)device)));
        View v;
        read(out_[j], v);
        return v;
    }
    void returned(int n_out) {
        torch::jit::drop(*stack_, n_);
        for (int j = 0; j < n_out; ++j) stack_->emplace_back(std::move(out_[j]));
    }

   private:
    // data_ptr(), as the stable ABI's getter: a copy-on-write tensor gets its own storage before
    // a kernel writes it (const_data_ptr() would hand over the storage it still shares).
    static void read(const at::Tensor& t, View& v) {
        const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
        const c10::Device device = impl->device();
        v.set(impl, impl->dim(), impl->sizes().data(), impl->strides().data(), (int32_t)t.scalar_type(),
              (int32_t)device.type(), device.index(), t.data_ptr());
    }
    torch::jit::Stack* stack_;
    int n_;
    const c10::IValue* args_;
    at::Tensor out_[2];
};

template <int O>
void boxed(const c10::OperatorHandle& handle, torch::jit::Stack* stack) {
    NativeFront in(kOps[O], handle.schema(), stack);
    serve<O>(in);
}

template <size_t... I>
void register_all(torch::Library& m, std::index_sequence<I...>) {
    (m.impl(kOps[I].name, torch::CppFunction::makeFromBoxedFunction<&boxed<(int)I>>()), ...);
}

}  // namespace

TORCH_LIBRARY_IMPL(mla_gen, CUDA, m) {
    use_the_package_images();
    register_all(m, std::make_index_sequence<kNumOps>{});
}

TORCH_LIBRARY_IMPL(mla_gen, CPU, m) {
    if (cpu_tests_wanted()) register_all(m, std::make_index_sequence<kNumOps>{});
}
