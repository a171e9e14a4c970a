// The compiled op's work, shared by its two builds (mla_gen_ops.cpp: the LibTorch stable ABI, one
// binary for torch >= 2.10; mla_gen_ops_native.cpp: TORCH_LIBRARY for one torch release, which the
// dispatcher calls without the stable ABI's per-argument boxing). Each build reads a call's
// arguments its own way (a "front": given, tensor, integer, text, flag, allocate, returned)
// and hands it to serve<O>; everything else is here, from the table python/setup.py writes
// (mla_gen_ops.h, from mla_gen/binding.json and the packaged manifest: which argument of an op is
// which tensor, free integer or option; how an error names a call; the texts of the torch layer's
// refusals; per kernel a call can name, how its parameters read the tensors). The Python path reads
// the same table, so nothing of it is written here. The kernel is the C launcher's selection
// (mla_select: the rule every host applies); the launcher applies the contract (the same checks
// and texts as every host), its size rules and specializations, and loads each image, on first
// use, from the package's kernels/ folder.
//
// A call whose layout (each tensor's dtype, device, sizes and strides, which optional arguments
// are given, the options) is one of this thread's last few calls' skips the op's checks, the
// selection and the launcher's full check: it launches through the plan the launcher prepared
// for that layout (mla_prepare), which checks only what the layout leaves open (each pointer's
// alignment, overlaps, the free integers' bounds) and runs the full check where anything is off,
// so every refusal is the full check's.
//
// The hot path allocates nothing (merge_states allocates its outputs) and calls no Python.
// Errors throw std::runtime_error, which the dispatcher raises as a RuntimeError.
// Included once, by the front, after torch's headers (the AOTI shim: dtypes, the stream).
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

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

#include "mla_gen_ops_limits.h"  // the table's sizes: the most tensors, free integers, options of a kind...

#include "mla_gen_ops_types.h"

#include "mla_gen_ops.h"

constexpr int kNumOps = sizeof(kOps) / sizeof(kOps[0]);
constexpr int kMaxArgs = sizeof(OpRow::args) / sizeof(OpArg);  // of an op's schema
constexpr int kKeyDims = 4;  // tensors of more dims (refused anyway) are not kept
constexpr uint64_t kEmptyAddress = 1 << 12;  // an empty tensor's address (mla_gen/_plan.py's)

#include "torch_call.h"

bool cpu_test_mode = false;  // $MLA_GEN_EXT_CPU at load: CPU tensors too, a stand-in driver, stream 0

// A layout's plan: what its call's layout was, the launcher's struct as its first call filled it
// (pointers, _numel and free integers set anew per call) and the launch the launcher prepared.
struct Plan {
    struct Shape {
        int64_t dim, dtype, device_type, device, sizes[kKeyDims], strides[kKeyDims];
    } t[kMaxTensors];
    int op = -1, kind = 0, n_tensors = 0, n_free = 0;
    int free_given = 0, codes = 0;  // bit masks
    bool cpu = false;
    int32_t device = 0;
    int slot[kMaxTensors], free_slot[kMaxFree];
    // merge_states: the outputs' shapes, allocated per call like the states (dtype, device)
    int64_t out_sizes[2][3] = {}, out_strides[2][3] = {}, out_dims[2] = {};
    int n_out = 0;
    uint64_t args[kMaxSlots];
    size_t bytes = 0;
    mla_prepared prepared;

    bool fits(int o, const Call& c, int free_mask, int code_mask) const {
        if (op != o || free_given != free_mask || codes != code_mask) return false;
        for (int i = 0; i < n_tensors; ++i) {
            const View& v = c.t[i];
            const Shape& s = t[i];
            if (!v.h ? s.dim != -1
                     : s.dim != v.dim || s.dtype != v.dtype || s.device_type != v.device_type || s.device != v.device ||
                           std::memcmp(s.sizes, v.sizes, sizeof(int64_t) * v.dim) != 0 ||
                           std::memcmp(s.strides, v.strides, sizeof(int64_t) * v.dim) != 0)
                return false;
        }
        return true;
    }
    bool keep(const Call& c) {  // false where a tensor has more dims than a plan holds
        for (int i = 0; i < n_tensors; ++i) {
            const View& v = c.t[i];
            Shape& s = t[i];
            std::memset(&s, 0, sizeof s);
            s.dim = -1;
            if (!v.h) continue;
            if (v.dim > kKeyDims) return false;
            s = Shape{v.dim, v.dtype, v.device_type, v.device, {}, {}};
            std::memcpy(s.sizes, v.sizes, sizeof(int64_t) * v.dim);
            std::memcpy(s.strides, v.strides, sizeof(int64_t) * v.dim);
        }
        return true;
    }
};

// Each thread's last few layouts (any thread may call; none shares a plan).
constexpr int kPlans = 6;
thread_local Plan plans[kPlans];
thread_local int next_plan;

// The call as an error names it where no kernel serves (the kind's `what` over its fields).
std::string describe(const KindRow& k, const Call& c) {
    std::string values[8];
    for (int i = 0; i < k.n_rules; ++i) {
        const Rule& r = k.rules[i];
        const View& v = c.t[r.a];
        values[i] = r.kind == 0   ? torch_dtype(v.dtype)
                    : r.kind == 1 ? std::to_string(v.sizes[r.b])
                    : r.kind == 2 ? std::string(v.h ? r.yes : r.no)
                    : r.kind == 3 ? std::string(c.shown[r.a])
                                  : std::to_string(v.sizes[1] * v.sizes[2] / c.t[r.b].sizes[1]);
    }
    std::string what;
    for (const char* p = k.what; *p; ++p) {
        const char* end = *p == '{' ? std::strchr(p, '}') : nullptr;
        int hit = -1;
        for (int i = 0; end && i < k.n_rules; ++i)
            if (std::strlen(k.rules[i].name) == (size_t)(end - p - 1) && !std::strncmp(k.rules[i].name, p + 1, end - p - 1))
                hit = i;
        if (hit < 0) {
            what += *p;
        } else {
            what += values[hit];
            p = end;
        }
    }
    return what;
}

// The last few selections of this thread, by what decides them: the kind, the options, which
// arguments are given, their element types and ranks, and every size except those that only give
// an integer (the token count): a call of new T takes the previous choice, as mla_select would
// choose it (mla_gen/_select.py: such a size binds its integer; only disagreement counts, and a
// call whose tensors disagree is never cached).
struct Selection {
    int64_t key[1 + kMaxOptions + kMaxFree + kMaxTensors * (2 + kKeyDims)];
    int n = -1;
    const KernelRow* kernel = nullptr;
};
constexpr int kSelections = 8;
thread_local Selection selections[kSelections];
thread_local int next_selection;

bool selection_key(int kind, const Call& c, const mla_given* given, int n, Selection& s) {
    const KindRow& k = kKinds[kind];
    int64_t bound[kMaxSlots];
    bool has[kMaxSlots] = {};
    int m = 0;
    s.key[m++] = kind;
    for (int i = 0; i < kMaxOptions; ++i) s.key[m++] = c.code[i];
    for (int i = 0; i < kMaxFree; ++i) s.key[m++] = c.free_given[i];
    for (int g = 0; g < n; ++g) {  // the tensors given, the allocated outputs too, in the kind's order
        int i = 0;
        while (i < k.n_names && std::strcmp(k.names[i], given[g].name)) ++i;
        if (i == k.n_names) continue;  // a free integer
        if (given[g].rank > kKeyDims || m + 2 + given[g].rank > (int)(sizeof s.key / sizeof s.key[0])) return false;
        s.key[m++] = i | (int64_t)(given[g].elem ? c.t[i].dtype : -1) << 16;
        s.key[m++] = given[g].rank;
        for (int d = 0; d < given[g].rank; ++d) {
            const FreeDim& f = k.free_dims[i][d];
            const int64_t size = given[g].shape[d];
            if (f.slot < 0) {
                s.key[m++] = size;
            } else if (has[f.slot] && bound[f.slot] != size - f.add) {
                return false;  // the tensors disagree: mla_select's verdict depends on which
            } else {
                has[f.slot] = true, bound[f.slot] = size - f.add, s.key[m++] = -1;
            }
        }
    }
    s.n = m;
    return true;
}

const KernelRow* selected(const Selection& probe) {
    for (const Selection& s : selections)
        if (s.n == probe.n && !std::memcmp(s.key, probe.key, sizeof(int64_t) * probe.n)) return s.kernel;
    return nullptr;
}

// Whether tensor i is one the kind's checks and error fields read (mla_gen/_binding.py,
// Kind.described): those that say which kernel the call means.
bool described(const KindRow& k, int i) {
    if (i == k.typed) return true;
    for (int j = 0; j < k.n_checks; ++j)
        if (k.checks[j].a == i || (k.checks[j].kind == 1 && k.checks[j].b == i)) return true;
    for (int j = 0; j < k.n_rules; ++j) {
        const Rule& r = k.rules[j];
        if ((r.kind <= 1 && r.a == i) || (r.kind == 4 && (r.a == i || r.b == i))) return true;
    }
    return false;
}

// The call's group size where the kind has one (its group_size field), else 0.
int64_t group_size(const KindRow& k, const Call& c) {
    for (int j = 0; j < k.n_rules; ++j) {
        const Rule& r = k.rules[j];
        if (r.kind == 4) return c.t[r.a].sizes[1] * c.t[r.a].sizes[2] / c.t[r.b].sizes[1];
    }
    return 0;
}

std::string labels_text(const Param& p) {  // "T, H, D": the dims a kernel addresses a tensor by
    std::string labels;
    for (int q = 0; q < p.n_dims; ++q) labels += std::string(q ? ", " : "") + p.dims[q].label;
    return labels;
}

// A refusal of op O naming its arguments (kOpRenames: merge_states's v and s, not the kernels'
// states and states_lse), as mla_gen/_torch.py's renamed: each whole word that is such a parameter,
// not after a '.', and not the overlap text's English "other argument". The "no generated kernel"
// error names the spec's keys and stays.
std::string as_called(int o, const std::string& text) {
    const Renames& r = kOpRenames[o];
    if (!r.n || text.rfind("no generated", 0) == 0) return text;
    auto word = [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
    };
    std::string out;
    size_t i = 0;
    while (i < text.size()) {
        if (!word(text[i])) {
            out += text[i++];
            continue;
        }
        size_t j = i;
        while (j < text.size() && word(text[j])) ++j;
        const std::string w = text.substr(i, j - i);
        const char* to = nullptr;
        const bool english = !text.compare(j, 9, " argument") && (j + 9 == text.size() || !word(text[j + 9]));
        if ((i == 0 || text[i - 1] != '.') && !english)
            for (int q = 0; q < r.n; ++q)
                if (w == r.pairs[q].name) to = r.pairs[q].value;
        out += to ? to : w;
        i = j;
    }
    return out;
}

// A call without a plan: the torch layer's checks (mla_gen/_plan.py's, in its order, with its
// texts), the kernel by the launcher's selection, the integers from the tensors by the contract's
// dims, the launcher's full check and plan (a refusal throws its message).
void prepare(int o, Call& c, Plan& plan) {
    const OpRow& op = kOps[o];
    const KindRow& k0 = kKinds[op.kinds[0]];
    const KindRow& kb = kKinds[op.kinds[1]];
    const Dtypes& d = dtypes();
    bool ctx = false;  // a start location given (tensors of the second kind only)
    for (int i = k0.n_names; i < kb.n_names; ++i) ctx |= c.t[i].h != nullptr;
    if (ctx && (!c.t[k0.n_names].h || !c.t[k0.n_names + 1].h)) {
        const int given = c.t[k0.n_names].h ? k0.n_names : k0.n_names + 1;  // the start location given
        fail(format(kText_both_or_neither, {{"given", kb.names[given]}, {"missing", kb.names[2 * k0.n_names + 1 - given]}}));
    }
    const KindRow& k = ctx ? kb : k0;
    // The kind's lse_layout option where the op takes it as an argument (else -1): the refusal of
    // an lse given transposed names the layout to pass.
    int layout_option = -1;
    for (int i = 0; i < op.n_args; ++i)
        if (op.args[i].role == 2 && op.args[i].is_str)
            for (int j = 0; j < k.n_options; ++j)
                if (!std::strcmp(k.options[j], "lse_layout") && op.args[i].index == j) layout_option = j;
    if (op.n_allocated) {  // merge_states: the states' rank and device come first, as mla_gen.merge_states
        const Check& r = k.checks[0];
        const View& v = c.t[r.a];
        if (v.dim != r.rank)
            fail(format(kText_rank, {{"name", r.name}, {"rank", std::to_string(r.rank).c_str()},
                                     {"shape", tuple_text(v.sizes, v.dim).c_str()}}));
        if (v.device_type != d.cuda && !(cpu_test_mode && v.device_type == d.cpu))
            fail(format(kText_not_on_device, {{"name", r.name}, {"device", v.device_text().c_str()}}));
        const int64_t T = v.sizes[0], H = v.sizes[2], D = v.sizes[3];
        plan.n_out = 2;
        const int64_t rows[2][3] = {{T, H, D}, {T, H, 1}};
        for (int j = 0; j < 2; ++j) {
            plan.out_dims[j] = 3 - j;
            std::memcpy(plan.out_sizes[j], rows[j], sizeof rows[j]);
            const int64_t st[2][3] = {{H * D, D, 1}, {H, 1, 0}};
            std::memcpy(plan.out_strides[j], st[j], sizeof st[j]);
        }
    }
    // One device of the kind the op is registered for, in the kind's tensor order.
    const View* first = nullptr;
    int first_i = 0;
    for (int i = 0; i < k.n_names; ++i) {
        const View& v = c.t[i];
        if (!v.h) continue;
        const bool cpu = cpu_test_mode && v.device_type == d.cpu;
        if (v.device_type != d.cuda && !cpu)
            fail(format(kText_not_on_device, {{"name", k.names[i]}, {"device", v.device_text().c_str()}}));
        if (!first) {
            first = &v;
            first_i = i;
        } else if (v.device_type != first->device_type || v.device != first->device) {
            fail(format(kText_two_devices, {{"name", k.names[i]}, {"device", v.device_text().c_str()},
                                            {"first", k.names[first_i]}, {"first_device", first->device_text().c_str()}}));
        }
    }
    plan.cpu = first && first->device_type == d.cpu;
    plan.device = first ? first->device : 0;
    // What the call is, for the error where no kernel serves; its own refusals first.
    for (int i = 0; i < k.n_checks; ++i) {
        const Check& r = k.checks[i];
        const View& v = c.t[r.a];
        if (r.kind == 0 && v.dim != r.rank)
            fail(format(kText_rank, {{"name", r.name}, {"rank", std::to_string(r.rank).c_str()},
                                     {"shape", tuple_text(v.sizes, v.dim).c_str()}}));
        if (r.kind == 1) {
            const View& s = c.t[r.b];
            const int64_t hd = v.sizes[1] * v.sizes[2];
            if (s.sizes[1] < 1 || hd % s.sizes[1])
                fail(format(kText_groups, {{"name", r.name}, {"shape", tuple_text(s.sizes, s.dim).c_str()},
                                           {"hd", std::to_string(hd).c_str()}}));
        }
    }
    // The kernel: the launcher's selection over the call's tensors (element type of the typed
    // one, shapes), its free integers given (values left to each call) and options.
    mla_given given[kMaxTensors + kMaxFree];
    mla_option options[kMaxOptions];
    int n = 0;
    const int64_t* out_shape[2] = {plan.out_sizes[0], plan.out_sizes[1]};
    for (int i = 0; i < k.n_names; ++i) {
        const int j = op.n_allocated && i == op.allocated[1] ? 1 : op.n_allocated && i == op.allocated[0] ? 0 : -1;
        if (j >= 0) {  // an output merge_states allocates
            given[n++] = mla_given{k.names[i], 0, 0, 0, nullptr, (int)plan.out_dims[j], out_shape[j]};
            continue;
        }
        if (!c.t[i].h) continue;
        given[n++] = mla_given{k.names[i], 0, 0, 0, i == k.typed ? elem_of(c.t[i].dtype) : nullptr,
                               (int)c.t[i].dim, c.t[i].sizes};
    }
    for (int i = 0; i < k.n_free; ++i)
        if (c.free_given[i]) given[n++] = mla_given{k.free[i], 1, 0, 0, nullptr, 0, nullptr};
    for (int i = 0; i < k.n_options; ++i) options[i] = mla_option{k.options[i], c.select_value[i]};
    const int kind_index = (int)(&k - kKinds);
    Selection probe;
    const bool cacheable = selection_key(kind_index, c, given, n, probe);
    const KernelRow* kernel = cacheable ? selected(probe) : nullptr;
    if (!kernel) {
        int serves = 1;
        const char* name = mla_select(k.family, given, n, options, k.n_options, &serves);
        if (!name) {
            // Where the tensors that describe the call select a kernel, another tensor disagrees
            // with them (a head size, a dtype): that kernel's checks name which, not "no kernel".
            mla_given probe[kMaxTensors + kMaxFree];
            bool other = false;
            for (int g = 0; g < n; ++g) {
                probe[g] = given[g];
                int i = 0;
                while (i < k.n_names && std::strcmp(k.names[i], given[g].name)) ++i;
                if (i < k.n_names && !described(k, i)) {
                    probe[g].elem = nullptr, probe[g].rank = 0, probe[g].shape = nullptr;
                    other = true;
                }
            }
            if (other) name = mla_select(k.family, probe, n, options, k.n_options, &serves);
        }
        for (const KernelRow& r : kKernels)
            if (name && !std::strcmp(r.name, name)) kernel = &r;
        // The nearest kernel groups otherwise (its scales' width binds the head count, so it only
        // disagrees on a size): none serves this group size, and the error says which.
        const int64_t group = group_size(k, c);
        if (kernel && !serves && group && group != kernel->group_size) kernel = nullptr;
        if (kernel && cacheable) {
            probe.kernel = kernel;
            selections[next_selection] = probe;
            next_selection = (next_selection + 1) % kSelections;
        }
    }
    if (!kernel && op.n_allocated) {
        // The op returns the merged lse: where a kernel serves the call without one, that is what
        // the error says (mla_gen/functions.py's _merge_states), not "no kernel".
        mla_given without[kMaxTensors + kMaxFree];
        int m = 0;
        for (int g = 0; g < n; ++g)
            if (std::strcmp(given[g].name, k.names[op.allocated[1]])) without[m++] = given[g];
        int serves = 1;
        if (mla_select(k.family, without, m, options, k.n_options, &serves)) fail(kText_no_states_lse);
    }
    if (!kernel)
        fail(format(kText_no_kernel, {{"family", k.family}, {"what", describe(k, c).c_str()}, {"label", kKernelsLabel}}));
    if (op.n_allocated) {  // the merged lse is returned: its kernel must write one
        bool lse = false;
        for (int i = 0; i < kernel->n_params; ++i) lse |= kernel->params[i].slot == k.slots[op.allocated[1]];
        if (!lse) fail(kText_no_states_lse);
    }
    // The integers from the tensors through the contract's dims, where the call does not give them.
    const Family& fam = kFamilies[kernel->family];
    uint64_t* a = plan.args;
    std::memcpy(a, fam.init, fam.bytes);
    plan.bytes = fam.bytes;
    bool set[kMaxSlots] = {};
    for (int i = 0; i < k.n_free; ++i)
        if (c.free_given[i] && k.free_slots[i] >= 0) set[k.free_slots[i]] = true;
    const View* by_slot[kMaxSlots] = {};
    View allocated[2];
    for (int j = 0; j < plan.n_out; ++j) {  // stand-ins with the outputs' shapes
        allocated[j].h = (const void*)1;
        allocated[j].dim = plan.out_dims[j];
        allocated[j].sizes = plan.out_sizes[j];
        allocated[j].strides = plan.out_strides[j];
        allocated[j].dtype = j ? d.codes[0] : c.t[k.checks[0].a].dtype;
        c.t[op.allocated[j]] = allocated[j];
    }
    for (int i = 0; i < k.n_names; ++i)
        if (c.t[i].h && k.slots[i] >= 0) by_slot[k.slots[i]] = &c.t[i];
    // The tensors that describe the call first (a tensor that contradicts them is the one named),
    // then the rest, each in signature order: as mla_gen/_plan.py's _shaped.
    int order[kMaxSlots], n_order = 0;
    for (int pass = 0; pass < 2; ++pass)
        for (int i = 0; i < kernel->n_params; ++i) {
            const Param& p = kernel->params[i];
            if (!p.pointer || !p.n_dims || !by_slot[p.slot]) continue;
            int t = 0;
            while (t < k.n_names && k.slots[t] != p.slot) ++t;
            if ((t < k.n_names && described(k, t)) == (pass == 0)) order[n_order++] = i;
        }
    struct Gave {  // the tensor dim that gave an integer, named where another contradicts it
        const Param* p = nullptr;
        const View* v = nullptr;
        int q = 0;
    } gave[kMaxSlots];
    for (int o = 0; o < n_order; ++o) {
        const Param& p = kernel->params[order[o]];
        const View* v = by_slot[p.slot];
        if (v->dim != p.n_dims)
            fail(format(kText_param_rank, {{"name", p.name}, {"rank", std::to_string(p.n_dims).c_str()},
                                           {"labels", labels_text(p).c_str()},
                                           {"shape", tuple_text(v->sizes, v->dim).c_str()}}));
        for (int q = 0; q < p.n_dims; ++q) {
            const int s = p.dims[q].size_slot;
            if (s < 0 || set[s]) continue;
            const int64_t add = p.dims[q].size.add;
            if (v->sizes[q] < add) {  // the integer would be negative: the dim holds too few
                const char* param = "";
                for (int i = 0; i < kernel->n_params; ++i)
                    if (!kernel->params[i].pointer && kernel->params[i].slot == s) param = kernel->params[i].name;
                fail(format(kText_too_short, {{"name", p.name}, {"least", std::to_string(add).c_str()},
                                              {"label", p.dims[q].label}, {"param", param},
                                              {"shape", tuple_text(v->sizes, v->dim).c_str()}}));
            }
            a[s] = (uint64_t)(v->sizes[q] - add), set[s] = true, gave[s] = {&p, v, q};
        }
        for (int q = 0; q < p.n_dims; ++q) {
            const int s = p.dims[q].stride_slot;
            if (s >= 0 && !set[s]) a[s] = (uint64_t)v->stride(q), set[s] = true;
        }
    }
    // Each tensor laid out as the kernel addresses it; where its sizes are not those reordered (an
    // lse [H, T] for [T, H]) and one contradicts the tensor that gave it, both tensors are named.
    for (int o = 0; o < n_order; ++o) {
        const Param& p = kernel->params[order[o]];
        const View* v = by_slot[p.slot];
        int64_t sizes[8], strides[8];
        bool same_sizes = true, zero = false;
        std::string want;
        for (int q = 0; q < p.n_dims; ++q) {
            sizes[q] = eval(p.dims[q].size, a);
            strides[q] = eval(p.dims[q].stride, a);
            zero |= sizes[q] == 0;
            same_sizes &= v->sizes[q] == sizes[q];
            want += std::string(q ? ", " : "") + p.dims[q].label + "=" + std::to_string(sizes[q]);
        }
        bool same = same_sizes;  // and the strides of every dim over 1 element
        for (int q = 0; same && !zero && q < p.n_dims; ++q) same = sizes[q] <= 1 || v->strides[q] == strides[q];
        if (same) continue;
        int64_t mine[8], theirs[8];
        std::copy(v->sizes, v->sizes + p.n_dims, mine);
        std::copy(sizes, sizes + p.n_dims, theirs);
        std::sort(mine, mine + p.n_dims);
        std::sort(theirs, theirs + p.n_dims);
        const bool reordered = std::equal(mine, mine + p.n_dims, theirs);
        for (int q = 0; !reordered && q < p.n_dims; ++q) {
            const int s = p.dims[q].size_slot;
            const Gave& f = s >= 0 ? gave[s] : Gave();
            if (v->sizes[q] == sizes[q] || !f.p || f.p == &p) continue;
            fail(format(kText_disagree, {{"name", p.name}, {"label", p.dims[q].label},
                                         {"size", std::to_string(v->sizes[q]).c_str()},
                                         {"shape", tuple_text(v->sizes, v->dim).c_str()},
                                         {"labels", labels_text(p).c_str()}, {"first", f.p->name},
                                         {"first_label", f.p->dims[f.q].label},
                                         {"first_size", std::to_string(f.v->sizes[f.q]).c_str()},
                                         {"first_shape", tuple_text(f.v->sizes, f.v->dim).c_str()},
                                         {"first_labels", labels_text(*f.p).c_str()}}));
        }
        if (!same_sizes) {  // the wanted strides would be read from this tensor's own
            std::string text = format(kText_shape, {{"name", p.name}, {"shape", tuple_text(v->sizes, v->dim).c_str()},
                                                    {"want", want.c_str()}});
            // An lse given as the addressed one transposed, to an op that takes lse_layout: the
            // layout to pass (mla_gen/_plan.py's lse_hint, which the functions append).
            const size_t len = std::strlen(p.name);
            const bool lse = len >= 3 && !std::strcmp(p.name + len - 3, "lse");
            if (layout_option >= 0 && lse && p.n_dims == 2 && v->dim == 2 && v->sizes[0] == sizes[1] &&
                v->sizes[1] == sizes[0]) {
                const std::string labels = std::string(p.dims[1].label) + ", " + p.dims[0].label;
                text += format(kText_lse_layout_hint, {{"labels", labels.c_str()},
                                                      {"layout", kLseLayouts[1 - c.code[layout_option]]}});
            }
            fail(text);
        }
        fail(format(kText_layout, {{"name", p.name}, {"shape", tuple_text(v->sizes, v->dim).c_str()},
                                   {"strides", tuple_text(v->strides, v->dim).c_str()}, {"want", want.c_str()},
                                   {"want_strides", tuple_text(strides, p.n_dims).c_str()}}));
    }
    for (int i = 0; i < kernel->n_params; ++i) {
        const Param& p = kernel->params[i];
        const View* v = p.pointer ? by_slot[p.slot] : nullptr;
        const char* got = v ? elem_of(v->dtype) : "";
        if (v && *p.elem && std::strcmp(got, p.elem) && !(!std::strcmp(p.elem, "fp8_e4m3") && !std::strcmp(got, "u8")))
            fail(std::string(kernel->name) + ": " +
                 format(kText_elem, {{"name", p.name}, {"got", got}, {"want", p.elem}}));
    }
    plan.op = o;
    plan.kind = ctx ? op.kinds[1] : op.kinds[0];
    plan.n_tensors = kb.n_names;
    plan.n_free = k.n_free;
    for (int i = 0; i < kMaxTensors; ++i) plan.slot[i] = i < k.n_names ? k.slots[i] : -1;
    for (int i = 0; i < k.n_free; ++i) plan.free_slot[i] = k.free_slots[i];
    for (int i = 0; i < k.n_names; ++i)  // this call's buffers, for the full check
        if (c.t[i].h && k.slots[i] >= 0 && !(op.n_allocated && (i == op.allocated[0] || i == op.allocated[1])))
            a[k.slots[i]] = c.t[i].addr, a[k.slots[i] + 1] = (uint64_t)c.t[i].span;
    for (int j = 0; j < plan.n_out; ++j) {  // the outputs: placeholders of their extent, apart from every input
        const int s = k.slots[op.allocated[j]];
        int64_t span = 1;  // as View.read
        for (int q = 0; q < plan.out_dims[j]; ++q)
            span = span && plan.out_sizes[j][q] ? span + (plan.out_sizes[j][q] - 1) * plan.out_strides[j][q] : 0;
        a[s] = (uint64_t)1 << (60 - j), a[s + 1] = (uint64_t)span;
        c.t[op.allocated[j]] = View();
    }
    for (int i = 0; i < k.n_free; ++i)
        if (c.free_given[i] && k.free_slots[i] >= 0) a[k.free_slots[i]] = (uint64_t)c.free[i];
    if (mla_prepare(kernel->name, a, &plan.prepared) != MLA_OK) throw std::runtime_error(mla_last_error());
}


// One call of op O, its arguments read by `in` (the build's front): the fixed options, the
// tensors, free integers and options; this thread's plan for the layout, else one prepared; the
// buffers' addresses; the outputs `in` allocates (merge_states); the launch on torch's current
// stream; the outputs handed back.
template <int O, class Front>
void serve(Front& in) {
    const OpRow& op = kOps[O];
    Call c;
    int free_mask = 0, code_mask = 0;
    for (int i = 0; i < op.n_fixed; ++i) {
        const int j = op.fixed[i].index;
        c.select_value[j] = c.shown[j] = op.fixed[i].value;
        c.code[j] = !std::strcmp(op.fixed[i].value, kLseLayouts[1]);
    }
    for (int i = 0; i < op.n_args; ++i) {
        const OpArg& x = op.args[i];
        const bool given = !x.optional || in.given(i);
        if (x.role == 0) {
            if (given) in.tensor(i, c.t[x.index]);
        } else if (x.role == 1) {
            c.free_given[x.index] = given;
            c.free[x.index] = given ? in.integer(i) : 0;
            free_mask |= given << x.index;
        } else if (x.is_str) {  // lse_layout: one of kLseLayouts
            const std::string text = in.text(i);
            int code = -1;
            for (int j = 0; j < 2; ++j)
                if (text == kLseLayouts[j]) code = j;
            if (code < 0) fail(format(kText_lse_layout, {{"value", text.c_str()}}));
            c.code[x.index] = code;
            c.select_value[x.index] = c.shown[x.index] = kLseLayouts[code];
        } else {  // a bool option (ue8m0): "true"/"false" to select, True/False in messages
            const bool b = in.flag(i);
            c.code[x.index] = b;
            c.select_value[x.index] = b ? "true" : "false";
            c.shown[x.index] = b ? "True" : "False";
        }
    }
    for (int j = 0; j < 4; ++j) code_mask |= c.code[j] << j;

    Plan* plan = nullptr;
    for (Plan& p : plans)
        if (p.fits(O, c, free_mask, code_mask)) plan = &p;
    Plan fresh;
    if (!plan) {
        plan = &fresh;
        Call copy = c;  // prepare writes stand-ins for the outputs into its call
        try {
            prepare(O, copy, fresh);
        } catch (const std::runtime_error& e) {
            throw std::runtime_error(as_called(O, e.what()));
        }
        mla_gen_ext_plans.fetch_add(1, std::memory_order_relaxed);
        fresh.free_given = free_mask;
        fresh.codes = code_mask;
        if (fresh.keep(c)) {  // kept for the next calls of this layout
            plan = &plans[next_plan];
            next_plan = (next_plan + 1) % kPlans;
            *plan = fresh;
        }
    }
    uint64_t a[kMaxSlots];
    std::memcpy(a, plan->args, plan->bytes);
    for (int i = 0; i < plan->n_tensors; ++i)
        if (c.t[i].h && plan->slot[i] >= 0) a[plan->slot[i]] = c.t[i].addr, a[plan->slot[i] + 1] = (uint64_t)c.t[i].span;
    for (int i = 0; i < plan->n_free; ++i)
        if (c.free_given[i] && plan->free_slot[i] >= 0) a[plan->free_slot[i]] = (uint64_t)c.free[i];
    for (int j = 0; j < plan->n_out; ++j) {  // merge_states: its outputs, on the states' device
        const View& states = c.t[kKinds[plan->kind].checks[0].a];
        const View v = in.allocate(j, plan->out_dims[j], plan->out_sizes[j], plan->out_strides[j],
                                   j ? dtypes().codes[0] : states.dtype, states.device_type, states.device);
        const int s = plan->slot[op.allocated[j]];
        a[s] = v.addr, a[s + 1] = (uint64_t)v.span;
    }
    if (mla_gen_driver_open() != 0) fail(std::string(op.name) + ": " + mla_gen_driver_error());
    mla_status s;
    if (plan->cpu) {
        s = mla_launch_prepared(&plan->prepared, nullptr, a);
    } else {
        Context ctx(plan->device);
        void* st = nullptr;
        ok(aoti_torch_get_current_cuda_stream(plan->device, &st), "aoti_torch_get_current_cuda_stream");
        s = mla_launch_prepared(&plan->prepared, (CUstream)st, a);
    }
    if (s != MLA_OK) throw std::runtime_error(as_called(O, mla_last_error()));
    mla_gen_ext_launches.fetch_add(1, std::memory_order_relaxed);
    in.returned(plan->n_out);
}

// The CPU registration's switch (tests without a GPU, python/tests/test_extension_cpu.py): with
// $MLA_GEN_EXT_CPU set when the library loads, CPU tensors go through the same path into a
// stand-in driver ($MLA_GEN_LIBCUDA).
bool cpu_tests_wanted() {
    const char* flag = std::getenv("MLA_GEN_EXT_CPU");
    cpu_test_mode = flag && *flag && std::strcmp(flag, "0") != 0;
    return cpu_test_mode;
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
