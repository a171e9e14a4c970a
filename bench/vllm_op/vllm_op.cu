// The host-cost bar of issue #22: a compiled TORCH_LIBRARY op whose launcher works the way vLLM's
// (csrc/attention/merge_attn_states.cu) does: tensors by reference through the dispatcher,
// TORCH_CHECKs on the options, a device guard, the current stream, a dtype switch, one launch.
// Its kernel is the vLLM-style baseline of the peer benchmark (../peers/peers.cu). Built on the GPU
// machine by bench/host_cost.py (torch.utils.cpp_extension.load); nothing here ships.

#include "../peers/peers.cu"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/all.h>
#include <torch/library.h>

#include <optional>

namespace {

void merge_attn_states(torch::Tensor& output, std::optional<torch::Tensor> output_lse,
                       const torch::Tensor& prefix_output, const torch::Tensor& prefix_lse,
                       const torch::Tensor& suffix_output, const torch::Tensor& suffix_lse,
                       std::optional<int64_t> prefill_tokens_with_context) {
    const int64_t num_tokens = output.size(0), num_heads = output.size(1), head_size = output.size(2);
    const int64_t pack = 16 / output.element_size();
    TORCH_CHECK(head_size % pack == 0, "head_size must be a multiple of ", pack);
    TORCH_CHECK(output.is_contiguous() && prefix_output.is_contiguous() && suffix_output.is_contiguous(),
                "the vLLM-style baseline takes contiguous tensors");
    const int64_t n = prefill_tokens_with_context.value_or(num_tokens);
    TORCH_CHECK(n >= 0 && n <= num_tokens, "prefill_tokens_with_context must be in 0..num_tokens");
    float* lse = output_lse.has_value() ? output_lse->data_ptr<float>() : nullptr;
    const c10::cuda::OptionalCUDAGuard guard(prefix_output.device());
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    int err;
    switch (output.scalar_type()) {
        case at::ScalarType::Float:
            err = vllm_merge_f32(output.data_ptr(), lse, prefix_output.data_ptr(), prefix_lse.data_ptr<float>(),
                                 suffix_output.data_ptr(), suffix_lse.data_ptr<float>(), num_tokens, num_heads,
                                 head_size, n, stream);
            break;
        case at::ScalarType::Half:
            err = vllm_merge_f16(output.data_ptr(), lse, prefix_output.data_ptr(), prefix_lse.data_ptr<float>(),
                                 suffix_output.data_ptr(), suffix_lse.data_ptr<float>(), num_tokens, num_heads,
                                 head_size, n, stream);
            break;
        case at::ScalarType::BFloat16:
            err = vllm_merge_bf16(output.data_ptr(), lse, prefix_output.data_ptr(), prefix_lse.data_ptr<float>(),
                                  suffix_output.data_ptr(), suffix_lse.data_ptr<float>(), num_tokens, num_heads,
                                  head_size, n, stream);
            break;
        default:
            TORCH_CHECK(false, "unsupported dtype ", output.scalar_type());
    }
    TORCH_CHECK(err == 0, "launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// The same schema doing nothing: the floor of a TORCH_LIBRARY op (unboxed, at::Tensor) beside the
// stable ABI's (bench/stable_floor/), so that the bar's own work shows.
void nothing(torch::Tensor&, std::optional<torch::Tensor>, const torch::Tensor&, const torch::Tensor&,
             const torch::Tensor&, const torch::Tensor&, std::optional<int64_t>) {}

}  // namespace

TORCH_LIBRARY(mla_gen_bench_vllm, m) {
    m.def("merge_attn_states(Tensor! output, Tensor!? output_lse, Tensor prefix_output, Tensor prefix_lse, "
          "Tensor suffix_output, Tensor suffix_lse, int? prefill_tokens_with_context=None) -> ()");
    m.def("nothing(Tensor! output, Tensor!? output_lse, Tensor prefix_output, Tensor prefix_lse, "
          "Tensor suffix_output, Tensor suffix_lse, int? prefill_tokens_with_context=None) -> ()");
}

TORCH_LIBRARY_IMPL(mla_gen_bench_vllm, CUDA, m) {
    m.impl("merge_attn_states", &merge_attn_states);
    m.impl("nothing", &nothing);
}
