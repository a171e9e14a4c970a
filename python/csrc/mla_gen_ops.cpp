// torch.ops.mla_gen.merge_attn_states as a compiled kernel of the LibTorch stable ABI (torch >=
// 2.10): one binary serves every later torch. The schema is defined in Python (mla_gen/ops.py,
// with the fakes); this file registers the CUDA implementation, which picks the kernel by the
// C launcher's selection (mla_select: the rule every host applies; its launcher found by name in
// mla_gen_table.h, written from the manifest at build time), turns the tensors into the
// generated C launcher's argument struct and calls it on torch's current stream.
// The launcher applies the manifest's contract (the same checks and texts as every host), its
// size rules and specializations, and loads images on first use.
//
// A call whose layout (each tensor's dtype, device, sizes and strides, which optional arguments
// are given, the threshold given or not) is one of this thread's last few calls' skips the op's
// checks, the selection and the launcher's full check: it launches through the plan the launcher
// prepared for that layout (mla_prepare), which checks only what the layout leaves open (each
// pointer's alignment, overlaps, the threshold's bounds) and runs the full check where anything
// is off, so every refusal is the full check's.
//
// The hot path allocates nothing and calls no Python: the boxed function reads the tensor handles
// off the stack itself (no torch::stable::Tensor, whose shared_ptr would allocate per argument).
// Errors throw std::runtime_error("<kernel>: <problem>"), which the dispatcher raises as a
// RuntimeError (the plain Python function does not come here: docs/PYTHON.md, "The compiled op").

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/stableivalue_conversions.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "cuda.h"  // driver/cuda.h: the driver through dlopen
#include "mla_kernels.h"

#if defined(__GLIBC__) && defined(__x86_64__)
// dladdr's first version, which every glibc has (driver/driver.c does the same for dlopen).
__asm__(".symver dladdr,dladdr@GLIBC_2.2.5");
#endif

// Declared by shim.h only for CUDA builds of torch (USE_CUDA); libtorch_cuda.so defines it.
extern "C" AOTI_TORCH_EXPORT AOTITorchError aoti_torch_get_current_cuda_stream(int32_t device_index,
                                                                               void** ret_stream);

// Calls that launched (or had nothing to launch), for mla_gen.stats()["launches"], and calls that
// prepared a plan (a layout not among the thread's last few), for stats()["plans"]; read with ctypes.
extern "C" {
__attribute__((visibility("default"))) std::atomic<uint64_t> mla_gen_ext_launches{0};
__attribute__((visibility("default"))) std::atomic<uint64_t> mla_gen_ext_plans{0};
}

namespace {

typedef mla_status (*Launcher)(CUstream, const mla_merge_attn_states_args*);

enum Dtype { F16 = 0, BF16 = 1, F32 = 2 };

// The launcher of each of the folder's merge_attn_states kernels that a call can name (not a size
// rule's range or a specialization: the launcher reaches those itself). Which one serves a call
// is the C launcher's selection (mla_select), not this table's.
struct Entry {
    const char* name;
    Launcher launch;
};

#include "mla_gen_table.h"  // static const Entry kEntries[]; kKernelsLabel

constexpr int kNumEntries = sizeof(kEntries) / sizeof(kEntries[0]);
constexpr uint64_t kEmptyAddress = 1 << 12;  // an empty tensor's address (mla_gen/_plan.py's)

[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char* fmt, ...) {
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    throw std::runtime_error(buf);
}

void ok(AOTITorchError e, const char* what) {
    if (e != AOTI_TORCH_SUCCESS) fail("mla_gen: %s failed", what);
}

// The torch codes of the dtypes the kernels take, asked once.
struct Codes {
    int32_t f16, bf16, f32, e4m3, i32, cuda, cpu;
    Codes()
        : f16(aoti_torch_dtype_float16()), bf16(aoti_torch_dtype_bfloat16()), f32(aoti_torch_dtype_float32()),
          e4m3(aoti_torch_dtype_float8_e4m3fn()), i32(aoti_torch_dtype_int32()), cuda(aoti_torch_device_type_cuda()),
          cpu(aoti_torch_device_type_cpu()) {}
};
const Codes& codes() {
    static const Codes c;
    return c;
}

const char* dtype_name(int32_t d) {
    const Codes& c = codes();
    if (d == c.f16) return "f16";
    if (d == c.bf16) return "bf16";
    if (d == c.f32) return "f32";
    if (d == c.e4m3) return "fp8_e4m3";
    if (d == c.i32) return "i32";
    return "another dtype";
}

// What the call needs of a tensor, read once.
struct View {
    AtenTensorHandle h = nullptr;
    const char* name = "";
    int64_t dim = 0;
    const int64_t* sizes = nullptr;
    const int64_t* strides = nullptr;
    int32_t dtype = 0, device_type = 0, device = 0;
    uint64_t addr = 0;
    int64_t span = 0;  // elements from addr to the last one the view holds, inclusive

    void read(AtenTensorHandle t, const char* n) {
        h = t;
        name = n;
        void* p = nullptr;
        int64_t* sz = nullptr;
        int64_t* st = nullptr;
        ok(aoti_torch_get_dim(t, &dim), "aoti_torch_get_dim");
        ok(aoti_torch_get_sizes(t, &sz), "aoti_torch_get_sizes");
        ok(aoti_torch_get_strides(t, &st), "aoti_torch_get_strides");
        ok(aoti_torch_get_dtype(t, &dtype), "aoti_torch_get_dtype");
        ok(aoti_torch_get_device_type(t, &device_type), "aoti_torch_get_device_type");
        ok(aoti_torch_get_device_index(t, &device), "aoti_torch_get_device_index");
        ok(aoti_torch_get_data_ptr(t, &p), "aoti_torch_get_data_ptr");
        sizes = sz;
        strides = st;
        addr = (uint64_t)(uintptr_t)p;
        span = 1;
        for (int64_t k = 0; k < dim; ++k) {
            if (sizes[k] == 0) {
                span = 0;
                break;
            }
            span += (sizes[k] - 1) * (strides[k] < 0 ? -strides[k] : strides[k]);
        }
        if (addr == 0 && span == 0) addr = kEmptyAddress;  // as the Python path: empty, not null
    }
    // Dim k's stride as the kernel gets it: a size-1 dim takes the packed stride (mla_gen/_plan.py's
    // _stride), so that one-token or one-head calls still qualify for the dense kernel.
    int64_t stride(int64_t k) const {
        if (sizes[k] > 1) return strides[k];
        return k + 1 < dim ? stride(k + 1) * sizes[k + 1] : 1;
    }
};

// The tensor handles of one call: each is the call's to delete, whatever happens.
struct Owned {
    AtenTensorHandle h[10] = {};
    int n = 0;
    ~Owned() {
        for (int i = 0; i < n; ++i)
            if (h[i]) aoti_torch_delete_tensor_object(h[i]);
    }
};

AtenTensorHandle tensor_at(StableIValue v) { return torch::stable::detail::to<AtenTensorHandle>(v); }

// An optional argument: a pointer to a StableIValue (allocated by torch, ours to free), or null.
bool optional_at(StableIValue v, StableIValue* out) {
    StableIValue* p = torch::stable::detail::to<StableIValue*>(v);
    if (!p) return false;
    *out = *p;
    delete p;
    return true;
}

void shape_error(const View& v, const char* want, const int64_t* sizes, const int64_t* strides, int n) {
    char got[160] = "(", gst[160] = "(", wst[160] = "(";
    for (int64_t k = 0; k < v.dim; ++k) {
        snprintf(got + strlen(got), sizeof got - strlen(got), k ? ", %lld" : "%lld", (long long)v.sizes[k]);
        snprintf(gst + strlen(gst), sizeof gst - strlen(gst), k ? ", %lld" : "%lld", (long long)v.strides[k]);
    }
    for (int k = 0; k < n; ++k)
        snprintf(wst + strlen(wst), sizeof wst - strlen(wst), k ? ", %lld" : "%lld", (long long)strides[k]);
    (void)sizes;
    fail("%s has shape %s%s) and strides %s%s); the kernel addresses it as [%s] with strides %s%s) (strides of "
         "size-1 dims do not matter)",
         v.name, got, v.dim == 1 ? "," : "", gst, v.dim == 1 ? "," : "", want, wst, n == 1 ? "," : "");
}

// The rank the kernel addresses the tensor with (labels: one letter a dim).
void rank(const View& v, int n, const char* labels) {
    if (!v.h || v.dim == n) return;
    char dims[64] = "", got[160] = "(";
    for (int k = 0; k < n; ++k)
        snprintf(dims + strlen(dims), sizeof dims - strlen(dims), k ? ", %c" : "%c", labels[k]);
    for (int64_t k = 0; k < v.dim; ++k)
        snprintf(got + strlen(got), sizeof got - strlen(got), k ? ", %lld" : "%lld", (long long)v.sizes[k]);
    fail("%s must have %d dimensions [%s], got shape %s%s)", v.name, n, dims, got, v.dim == 1 ? "," : "");
}

// The tensor has exactly these sizes and, where a size exceeds 1, these strides.
void expect(const View& v, const int64_t* sizes, const int64_t* strides, int n, const char* labels) {
    bool same = v.dim == n;
    for (int k = 0; same && k < n; ++k) same = v.sizes[k] == sizes[k];
    bool zero = false;
    for (int k = 0; k < n; ++k) zero |= sizes[k] == 0;
    for (int k = 0; same && !zero && k < n; ++k) same = sizes[k] <= 1 || v.strides[k] == strides[k];
    if (same) return;
    char want[160] = "";
    const char* l = labels;
    for (int k = 0; k < n; ++k) {
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%c=%lld", k ? ", " : "", *l, (long long)sizes[k]);
        l += 1;
    }
    shape_error(v, want, sizes, strides, n);
}

// The kernel that serves a call, by the rule every host applies (docs/MANIFEST.md, "Selection";
// the C launcher's mla_select, held to tests/contract/select.json like Rust and Python): the
// call's buffers with their element types and sizes, the threshold given or not (its value left
// open, as a plan of the Python path leaves it), head-major lse. -1 where no kernel serves or the
// one chosen has no launcher here.
int choose(const char* elem, const char* out_elem, int64_t T, int64_t H, int64_t D, bool lse, bool thr, bool scale,
           int64_t B) {
    const int64_t rows[3] = {T, H, D}, lse_shape[2] = {H, T}, locs[1] = {B + 1};
    mla_given given[10];  // five tensors, output_lse, output_scale, two start locations, the threshold
    int n = 0;
    auto buffer = [&](const char* name, const char* e, int rank, const int64_t* shape) {
        given[n++] = mla_given{name, 0, 0, 0, e, rank, shape};
    };
    buffer("output", out_elem, 3, rows);
    buffer("prefix_output", elem, 3, rows);
    buffer("prefix_lse", "f32", 2, lse_shape);
    buffer("suffix_output", elem, 3, rows);
    buffer("suffix_lse", "f32", 2, lse_shape);
    if (lse) buffer("output_lse", "f32", 2, lse_shape);
    if (scale) buffer("output_scale", "f32", 0, nullptr);
    if (B >= 0) {
        buffer("query_start_loc", "i32", 1, locs);
        buffer("context_start_loc", "i32", 1, locs);
    }
    if (thr) given[n++] = mla_given{"prefill_tokens_with_context", 1, 0, 0, nullptr, 0, nullptr};
    const mla_option head_major{"lse_layout", "head_major"};
    const char* name = mla_select("merge_attn_states", given, n, &head_major, 1, nullptr);
    if (!name) return -1;
    for (int i = 0; i < kNumEntries; ++i)
        if (std::strcmp(kEntries[i].name, name) == 0) return i;
    return -1;
}

// The last choice, for the next call with the same key (a packed key and index; any thread):
// what selection reads of a call (dtypes, head size, the optional arguments given) decides it.
std::atomic<uint64_t> last_choice{~0ull};

int chosen(int dtype, const char* elem, int64_t T, int64_t H, int64_t D, int fp8, int lse, int thr, int64_t B) {
    if (D < 0 || D >= (1 << 20)) return -1;
    const int ctx = B >= 0;
    const uint64_t key = (uint64_t)D | (uint64_t)dtype << 20 | (uint64_t)fp8 << 22 | (uint64_t)lse << 23 |
                         (uint64_t)thr << 24 | (uint64_t)ctx << 25;
    const uint64_t last = last_choice.load(std::memory_order_relaxed);
    if ((last & 0xffffffffull) == key) return (int)(last >> 32);
    const int i = choose(elem, fp8 ? "fp8_e4m3" : elem, T, H, D, lse, thr, fp8, B);
    if (i >= 0) last_choice.store(key | (uint64_t)i << 32, std::memory_order_relaxed);
    return i;
}

// The device's primary context made current for the call where another context (or none) is
// current: what the Python path's _cuda._Current does. Torch's streams belong to the primary
// context; a context made with cuCtxCreate on the same device is not it.
std::atomic<CUcontext> primary[64];

struct Context {
    bool pushed = false;
    explicit Context(int32_t device) {
        CUcontext want = device >= 0 && device < 64 ? primary[device].load(std::memory_order_relaxed) : nullptr;
        CUcontext current = nullptr;
        if (want && cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == want) return;
        if (!want) {
            CUresult r = cuDevicePrimaryCtxRetain(&want, device);  // retained for the process, as _cuda does
            if (r != CUDA_SUCCESS) fail("mla_gen: cuDevicePrimaryCtxRetain(%d) failed: CUresult %d", device, (int)r);
            if (device >= 0 && device < 64) {
                CUcontext none = nullptr;
                if (!primary[device].compare_exchange_strong(none, want)) want = none;  // another thread's: the same
            }
            if (cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == want) return;
        }
        const CUresult r = cuCtxPushCurrent(want);
        if (r != CUDA_SUCCESS) fail("mla_gen: cuCtxPushCurrent failed: CUresult %d", (int)r);
        pushed = true;
    }
    ~Context() {
        if (pushed) {
            CUcontext popped;
            cuCtxPopCurrent(&popped);
        }
    }
};

bool cpu_test_mode = false;  // $MLA_GEN_EXT_CPU at load: CPU tensors too, a stand-in driver, stream 0

constexpr int kTensors = 9;  // output, output_lse, prefix/suffix output and lse, scale, start locations
constexpr int kKeyDims = 4;  // tensors of more dims (refused anyway) are not kept

// What a call's layout is made of: per tensor (-1 dims: not given) its dims, sizes, strides, dtype
// and device; and whether the threshold is given.
struct Key {
    struct Shape {
        int64_t dim, dtype, device_type, device, sizes[kKeyDims], strides[kKeyDims];
    } t[kTensors];
    int64_t thr;

    // Whether the call's tensors are the key's (compared in place: no key made per call).
    bool fits(const View* const* views, bool threshold) const {
        if (thr != threshold) return false;
        for (int i = 0; i < kTensors; ++i) {
            const View& v = *views[i];
            const Shape& s = t[i];
            if (!v.h ? s.dim != -1
                     : s.dim != v.dim || s.dtype != v.dtype || s.device_type != v.device_type || s.device != v.device ||
                           std::memcmp(s.sizes, v.sizes, sizeof(int64_t) * v.dim) != 0 ||
                           std::memcmp(s.strides, v.strides, sizeof(int64_t) * v.dim) != 0)
                return false;
        }
        return true;
    }

    // False where a tensor has more dims than a key holds.
    bool make(const View* const* views, bool threshold) {
        std::memset(this, 0, sizeof *this);
        thr = threshold;
        for (int i = 0; i < kTensors; ++i) {
            const View& v = *views[i];
            Shape& s = t[i];
            if (!v.h) {
                s.dim = -1;
                continue;
            }
            if (v.dim > kKeyDims) return false;
            s.dim = v.dim;
            s.dtype = v.dtype;
            s.device_type = v.device_type;
            s.device = v.device;
            std::memcpy(s.sizes, v.sizes, sizeof(int64_t) * v.dim);
            std::memcpy(s.strides, v.strides, sizeof(int64_t) * v.dim);
        }
        return true;
    }
};

// A layout's plan: the launcher's struct as its first call filled it (pointers and the threshold
// set anew per call) and the launch the launcher prepared for it.
struct Plan {
    Key key;
    int used;   // 0: empty
    int entry;  // kEntries[entry]: the kernel called
    bool cpu;   // CPU tensors (the CPU test mode): no context, stream 0
    mla_merge_attn_states_args args;
    mla_prepared prepared;
};

// Each thread's last few layouts (any thread may call; none shares a plan). A serving engine
// alternates a handful: prefill and decode, with and without output_lse.
constexpr int kPlans = 4;
thread_local Plan plans[kPlans];
thread_local int next_plan;

Plan* find_plan(const View* const* views, bool thr) {
    for (Plan& p : plans)
        if (p.used && p.key.fits(views, thr)) return &p;
    return nullptr;
}

// The call's buffers in the launcher's struct: what a plan leaves open (the pointers), with
// their _numel (which the plan holds to its own).
void set_buffers(mla_merge_attn_states_args& a, const View& out, const View& out_lse, const View& prefix,
                 const View& prefix_lse, const View& suffix, const View& suffix_lse, const View& scale, const View& qsl,
                 const View& csl, int64_t B) {
    a.output = (void*)(uintptr_t)out.addr;
    a.output_numel = out.span;
    a.output_lse = out_lse.h ? (float*)(uintptr_t)out_lse.addr : nullptr;
    a.output_lse_numel = out_lse.h ? out_lse.span : 0;
    a.prefix_output = (const void*)(uintptr_t)prefix.addr;
    a.prefix_output_numel = prefix.span;
    a.prefix_lse = (const float*)(uintptr_t)prefix_lse.addr;
    a.prefix_lse_numel = prefix_lse.span;
    a.suffix_output = (const void*)(uintptr_t)suffix.addr;
    a.suffix_output_numel = suffix.span;
    a.suffix_lse = (const float*)(uintptr_t)suffix_lse.addr;
    a.suffix_lse_numel = suffix_lse.span;
    (void)scale;
    (void)qsl;
    (void)csl;
    (void)B;
    MLA_GEN_SET_OPTIONAL_FIELDS(a)  // mla_gen_table.h: the fields only some kernels of the folder have
}

// A call without a plan: the op's checks (what C cannot check, it has no element types, and what
// the shapes must say), the kernel by the launcher's selection, and the launcher's plan for it
// (its full check: a refusal throws its message): plan.entry, plan.cpu, plan.args (this call's)
// and plan.prepared.
void prepare(const View* const* t, bool thr, int64_t threshold, int64_t B, Plan& plan) {
    const View &out = *t[0], &out_lse = *t[1], &prefix = *t[2], &prefix_lse = *t[3], &suffix = *t[4],
               &suffix_lse = *t[5], &scale = *t[6], &qsl = *t[7], &csl = *t[8];
    const Codes& c = codes();
    if (!qsl.h != !csl.h)
        fail("%s given without %s: the empty-context mask needs both start locations (int32 [B + 1] each), or "
             "neither", qsl.h ? "query_start_loc" : "context_start_loc", qsl.h ? "context_start_loc" : "query_start_loc");

    // One device of the kind the op is registered for.
    const int32_t want_type = cpu_test_mode && out.device_type == c.cpu ? c.cpu : c.cuda;
    for (int i = 0; i < kTensors; ++i) {
        if (!t[i]->h) continue;
        if (t[i]->device_type != want_type) fail("%s is not on a CUDA device; the kernels run on a CUDA device", t[i]->name);
        if (t[i]->device != out.device)
            fail("%s is on device %d, output on device %d; all tensors must be on one device", t[i]->name, t[i]->device,
                 out.device);
    }
    plan.cpu = want_type == c.cpu;

    // The kernel: the inputs' dtype and head size, the output kind, the options given.
    if (prefix.dim != 3) {
        char got[160] = "(";
        for (int64_t k = 0; k < prefix.dim; ++k)
            snprintf(got + strlen(got), sizeof got - strlen(got), k ? ", %lld" : "%lld", (long long)prefix.sizes[k]);
        fail("prefix_output must have 3 dimensions, got shape %s%s)", got, prefix.dim == 1 ? "," : "");
    }
    const int64_t T = prefix.sizes[0], H = prefix.sizes[1], D = prefix.sizes[2];
    const int dtype = prefix.dtype == c.f16 ? F16 : prefix.dtype == c.bf16 ? BF16 : prefix.dtype == c.f32 ? F32 : -1;
    const int fp8 = scale.h != nullptr;
    const int i = dtype < 0 ? -1
                            : chosen(dtype, dtype_name(prefix.dtype), T, H, D, fp8, out_lse.h != nullptr, thr, B);
    if (i < 0)
        fail("no generated merge_attn_states kernel for dtype=%s, head_size=%lld, output=%s, lse_layout=head_major%s "
             "in %s; add it to the spec ([[merge_attn_states]]) and regenerate, or set MLA_GEN_KERNELS",
             dtype_name(prefix.dtype), (long long)D, fp8 ? "fp8_e4m3" : "same",
             qsl.h ? ", with the empty-context mask (query_start_loc, context_start_loc)" : "", kKernelsLabel);
    const Entry& e = kEntries[i];
    plan.entry = i;

    const int32_t want_out = fp8 ? c.e4m3 : prefix.dtype;
    if (out.dtype != want_out) fail("%s: output is %s, the kernel takes %s", e.name, dtype_name(out.dtype), dtype_name(want_out));
    if (suffix.dtype != prefix.dtype)
        fail("%s: suffix_output is %s, the kernel takes %s", e.name, dtype_name(suffix.dtype), dtype_name(prefix.dtype));
    for (const View* v : {&prefix_lse, &suffix_lse, &out_lse, &scale})
        if (v->h && v->dtype != c.f32) fail("%s: %s is %s, the kernel takes f32", e.name, v->name, dtype_name(v->dtype));
    for (const View* v : {&qsl, &csl})
        if (v->h && v->dtype != c.i32) fail("%s: %s is %s, the kernel takes i32", e.name, v->name, dtype_name(v->dtype));
    // In the kernel's parameter order, as the Python path: ranks, then sizes and strides.
    const View* order[] = {&out, &out_lse, &prefix, &prefix_lse, &suffix, &suffix_lse};
    for (const View* v : order) {
        const bool rows = v == &out || v == &prefix || v == &suffix;  // [T, H, D], else lse [H, T]
        rank(*v, rows ? 3 : 2, rows ? "THD" : "HT");
    }
    const int64_t sizes[3] = {T, H, D}, lse_sizes[2] = {H, T}, lse_strides[2] = {T, 1};
    for (const View* v : order) {
        if (!v->h) continue;
        if (v->dim == 3) {
            const int64_t st[3] = {v->stride(0), v->stride(1), 1};
            expect(*v, sizes, st, 3, "THD");
        } else {
            expect(*v, lse_sizes, lse_strides, 2, "HT");
        }
    }
    if (qsl.h) {
        if (qsl.dim != 1) fail("query_start_loc must have 1 dimension [B + 1], got %lld", (long long)qsl.dim);
        const int64_t s[1] = {B + 1}, st[1] = {1};
        expect(qsl, s, st, 1, "B");
        expect(csl, s, st, 1, "B");
    }

    mla_merge_attn_states_args& a = plan.args;
    a = MLA_MERGE_ATTN_STATES_ARGS_INIT;
    set_buffers(a, out, out_lse, prefix, prefix_lse, suffix, suffix_lse, scale, qsl, csl, B);
    a.num_tokens = T;
    a.num_heads = H;
    a.output_token_stride = out.stride(0);
    a.output_head_stride = out.stride(1);
    a.prefix_token_stride = prefix.stride(0);
    a.prefix_head_stride = prefix.stride(1);
    a.suffix_token_stride = suffix.stride(0);
    a.suffix_head_stride = suffix.stride(1);
    if (thr) a.prefill_tokens_with_context = threshold;
    if (mla_prepare(e.name, &a, &plan.prepared) != MLA_OK) throw std::runtime_error(mla_last_error());
}

// merge_attn_states(Tensor! output, Tensor!? output_lse, Tensor prefix_output, Tensor prefix_lse,
//   Tensor suffix_output, Tensor suffix_lse, SymInt? prefill_tokens_with_context=None,
//   Tensor? output_scale=None, Tensor? query_start_loc=None, Tensor? context_start_loc=None) -> ()
void merge_attn_states_boxed(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
    if (num_args != 10 || num_outputs != 0)
        fail("mla_gen: merge_attn_states was registered with another schema (%llu arguments, %llu outputs)",
             (unsigned long long)num_args, (unsigned long long)num_outputs);
    // Take ownership of every handle first, so that none leaks whatever fails below.
    Owned own;
    StableIValue v;
    AtenTensorHandle out_h = tensor_at(stack[0]);
    own.h[own.n++] = out_h;
    AtenTensorHandle out_lse_h = optional_at(stack[1], &v) ? tensor_at(v) : nullptr;
    own.h[own.n++] = out_lse_h;
    AtenTensorHandle prefix_h = tensor_at(stack[2]), prefix_lse_h = tensor_at(stack[3]);
    AtenTensorHandle suffix_h = tensor_at(stack[4]), suffix_lse_h = tensor_at(stack[5]);
    own.h[own.n++] = prefix_h;
    own.h[own.n++] = prefix_lse_h;
    own.h[own.n++] = suffix_h;
    own.h[own.n++] = suffix_lse_h;
    const bool thr = optional_at(stack[6], &v);
    const int64_t threshold = thr ? torch::stable::detail::to<int64_t>(v) : 0;
    AtenTensorHandle scale_h = optional_at(stack[7], &v) ? tensor_at(v) : nullptr;
    own.h[own.n++] = scale_h;
    AtenTensorHandle qsl_h = optional_at(stack[8], &v) ? tensor_at(v) : nullptr;
    own.h[own.n++] = qsl_h;
    AtenTensorHandle csl_h = optional_at(stack[9], &v) ? tensor_at(v) : nullptr;
    own.h[own.n++] = csl_h;

    View out, out_lse, prefix, prefix_lse, suffix, suffix_lse, scale, qsl, csl;
    out.read(out_h, "output");
    prefix.read(prefix_h, "prefix_output");
    prefix_lse.read(prefix_lse_h, "prefix_lse");
    suffix.read(suffix_h, "suffix_output");
    suffix_lse.read(suffix_lse_h, "suffix_lse");
    if (out_lse_h) out_lse.read(out_lse_h, "output_lse");
    if (scale_h) scale.read(scale_h, "output_scale");
    if (qsl_h) qsl.read(qsl_h, "query_start_loc");
    if (csl_h) csl.read(csl_h, "context_start_loc");
    const int64_t B = qsl_h && qsl.dim == 1 ? qsl.sizes[0] - 1 : (qsl_h ? 0 : -1);

    // The plan of the call's layout, else the op's checks and selection (which make one).
    const View* const all[kTensors] = {&out, &out_lse, &prefix, &prefix_lse, &suffix, &suffix_lse, &scale, &qsl, &csl};
    Plan* plan = find_plan(all, thr);
    Plan fresh;
    if (!plan) {
        plan = &fresh;
        prepare(all, thr, threshold, B, fresh);
        mla_gen_ext_plans.fetch_add(1, std::memory_order_relaxed);
        if (fresh.key.make(all, thr)) {  // kept for the next calls of this layout
            fresh.used = 1;
            plan = &plans[next_plan];
            next_plan = (next_plan + 1) % kPlans;
            *plan = fresh;
        }
    }
    mla_merge_attn_states_args a = plan->args;
    set_buffers(a, out, out_lse, prefix, prefix_lse, suffix, suffix_lse, scale, qsl, csl, B);
    if (thr) a.prefill_tokens_with_context = threshold;

    if (mla_gen_driver_open() != 0) fail("%s: %s", kEntries[plan->entry].name, mla_gen_driver_error());
    mla_status s;
    if (plan->cpu) {
        s = mla_launch_prepared(&plan->prepared, nullptr, &a);
    } else {
        Context ctx(out.device);
        void* st = nullptr;
        ok(aoti_torch_get_current_cuda_stream(out.device, &st), "aoti_torch_get_current_cuda_stream");
        s = mla_launch_prepared(&plan->prepared, (CUstream)st, &a);
    }
    if (s != MLA_OK) throw std::runtime_error(mla_last_error());
    mla_gen_ext_launches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

// The images: the C launcher is compiled with MLA_IMAGES_FROM_FILES (python/setup.py), so this
// library embeds none and reads each, on its first load, from the package's kernels/ folder beside
// it (mla_gen/kernels: the manifest the launcher was generated from, and its files), checking its
// size and sha256 first. A failure here leaves no folder set: every launch then says so.
static void use_the_package_images() {
    Dl_info self{};
    if (!dladdr((const void*)&use_the_package_images, &self) || !self.dli_fname) return;
    char dir[4096];
    const char* slash = std::strrchr(self.dli_fname, '/');
    const int n = slash ? (int)(slash - self.dli_fname) : 1;
    if (snprintf(dir, sizeof dir, "%.*s/kernels", n, slash ? self.dli_fname : ".") >= (int)sizeof dir) return;
    mla_set_image_dir(dir);
}

STABLE_TORCH_LIBRARY_IMPL(mla_gen, CUDA, m) {
    use_the_package_images();
    m.impl("merge_attn_states", &merge_attn_states_boxed);
}

// Tests without a GPU (python/tests/test_extension_cpu.py): with $MLA_GEN_EXT_CPU set when the
// extension loads, CPU tensors go through the same path into a stand-in driver ($MLA_GEN_LIBCUDA).
STABLE_TORCH_LIBRARY_IMPL(mla_gen, CPU, m) {
    const char* flag = std::getenv("MLA_GEN_EXT_CPU");
    if (flag && *flag && std::strcmp(flag, "0") != 0) {
        cpu_test_mode = true;
        m.impl("merge_attn_states", &merge_attn_states_boxed);
    }
}
