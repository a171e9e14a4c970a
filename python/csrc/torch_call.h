// What the compiled op reads of a call and how it says what is wrong: errors, the texts' fields
// rendered as Python renders them, torch's dtypes, a tensor's view, the device's primary context.
// Included by op_core.h inside its anonymous namespace, after the table (mla_gen_ops.h: kElems)
// and its constants.
#pragma once

[[noreturn]] void fail(const std::string& text) { throw std::runtime_error(text); }

void ok(AOTITorchError e, const char* what) {
    if (e != AOTI_TORCH_SUCCESS) fail(std::string("mla_gen: ") + what + " failed");
}

// A text of the table with its {fields} replaced, as Python's str.format does for these.
std::string format(const char* text, std::initializer_list<NamePair> fields) {
    std::string out;
    for (const char* p = text; *p; ++p) {
        const char* end = *p == '{' ? std::strchr(p, '}') : nullptr;
        const NamePair* hit = nullptr;
        for (const NamePair& f : fields)
            if (end && std::strlen(f.name) == (size_t)(end - p - 1) && !std::strncmp(f.name, p + 1, end - p - 1)) hit = &f;
        if (!hit) {
            out += *p;
            continue;
        }
        out += hit->value;
        p = end;
    }
    return out;
}

std::string tuple_text(const int64_t* v, int64_t n) {  // as Python prints a tuple
    std::string s = "(";
    for (int64_t k = 0; k < n; ++k) s += (k ? ", " : "") + std::to_string(v[k]);
    return s + (n == 1 ? ",)" : ")");
}

// torch's dtypes by name, asked once; the manifest's element names come from the table.
struct Dtypes {
    NamePair names[11];
    int32_t codes[11];
    int32_t cpu, cuda;
    Dtypes() {
        const int32_t c[11] = {aoti_torch_dtype_float32(), aoti_torch_dtype_float16(), aoti_torch_dtype_bfloat16(),
                               aoti_torch_dtype_int32(),   aoti_torch_dtype_uint8(),   aoti_torch_dtype_bool(),
                               aoti_torch_dtype_float64(), aoti_torch_dtype_int64(),   aoti_torch_dtype_int8(),
                               aoti_torch_dtype_int16(),   aoti_torch_dtype_float8_e4m3fn()};
        const char* n[11] = {"float32", "float16", "bfloat16", "int32", "uint8", "bool",
                             "float64", "int64",   "int8",     "int16", "float8_e4m3fn"};
        for (int i = 0; i < 11; ++i) {
            codes[i] = c[i];
            names[i] = NamePair{n[i], "?"};
            for (const NamePair& e : kElems)
                if (!std::strcmp(e.name, n[i])) names[i].value = e.value;
        }
        cpu = aoti_torch_device_type_cpu();
        cuda = aoti_torch_device_type_cuda();
    }
    const NamePair* of(int32_t code) const {
        for (int i = 0; i < 11; ++i)
            if (codes[i] == code) return &names[i];
        return nullptr;
    }
};
const Dtypes& dtypes() {
    static const Dtypes d;
    return d;
}
std::string torch_dtype(int32_t code) {
    const NamePair* p = dtypes().of(code);
    return std::string("torch.") + (p ? p->name : "another dtype");
}
const char* elem_of(int32_t code) {  // mla_gen/_plan.py's _elem
    const NamePair* p = dtypes().of(code);
    return p ? p->value : "another dtype";
}

// What the call needs of a tensor, read once (each front's read: the stable ABI's getters, or
// the tensor's own fields).
struct View {
    const void* h = nullptr;  // the tensor's handle: null where the argument is not given
    int64_t dim = 0;
    const int64_t* sizes = nullptr;
    const int64_t* strides = nullptr;
    int32_t dtype = 0, device_type = 0, device = 0;  // c10's ScalarType and DeviceType codes (the shim's)
    uint64_t addr = 0;
    int64_t span = 0;  // elements from addr to the last one the view holds, inclusive

    void set(const void* handle, int64_t n, const int64_t* sz, const int64_t* st, int32_t type, int32_t dev_type,
             int32_t dev, const void* data) {
        h = handle;
        dim = n;
        sizes = sz;
        strides = st;
        dtype = type;
        device_type = dev_type;
        device = dev;
        addr = (uint64_t)(uintptr_t)data;
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
    // Dim k's stride as the kernel gets it: a size-1 dim takes the packed stride (_plan.py's _stride).
    int64_t stride(int64_t k) const {
        if (sizes[k] > 1) return strides[k];
        return k + 1 < dim ? stride(k + 1) * sizes[k + 1] : 1;
    }
    std::string device_text() const {  // as torch prints the device
        return device_type == dtypes().cpu ? std::string("cpu") : "cuda:" + std::to_string(device);
    }
};

// One call's arguments by the op's base kind: tensors, free integers, option codes (an index
// into kLseLayouts, or a bool), option texts for selection and for messages.
struct Call {
    View t[kMaxTensors];
    int64_t free[kMaxFree] = {};
    bool free_given[kMaxFree] = {};
    int code[kMaxOptions] = {};
    const char* select_value[kMaxOptions] = {};
    const char* shown[kMaxOptions] = {};
};

int64_t eval(const Expr& e, const uint64_t* a) {
    int64_t v = e.mul;
    for (int i = 0; i < e.n; ++i) v *= (int64_t)a[e.f[i]];
    return v + e.add;
}

// The device's primary context made current for the call where another context (or none) is
// current: what the Python path's _cuda._Current does.
std::atomic<CUcontext> primary[64];

struct Context {
    bool pushed = false;
    explicit Context(int32_t device) {
        CUcontext want = device >= 0 && device < 64 ? primary[device].load(std::memory_order_relaxed) : nullptr;
        CUcontext current = nullptr;
        if (want && cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == want) return;
        if (!want) {
            CUresult r = cuDevicePrimaryCtxRetain(&want, device);  // retained for the process, as _cuda does
            if (r != CUDA_SUCCESS)
                fail("mla_gen: cuDevicePrimaryCtxRetain(" + std::to_string(device) + ") failed: CUresult " +
                     std::to_string((int)r));
            if (device >= 0 && device < 64) {
                CUcontext none = nullptr;
                if (!primary[device].compare_exchange_strong(none, want)) want = none;  // another thread's: the same
            }
            if (cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == want) return;
        }
        const CUresult r = cuCtxPushCurrent(want);
        if (r != CUDA_SUCCESS) fail("mla_gen: cuCtxPushCurrent failed: CUresult " + std::to_string((int)r));
        pushed = true;
    }
    ~Context() {
        if (pushed) {
            CUcontext popped;
            cuCtxPopCurrent(&popped);
        }
    }
};

