// The types of the rows of mla_gen_ops.h, the table python/setup.py writes from
// mla_gen/binding.json (read by mla_gen/_binding.py) and the manifest. Included by op_core.h inside its anonymous
// namespace, before the table.
#pragma once

struct NamePair {
    const char* name;
    const char* value;
};
struct Family {  // a C launcher argument struct: every field 8 bytes, so a field is its index
    const char* name;
    const void* init;
    size_t bytes;
};
struct Rule {  // a field of a kind's `what` (mla_gen/binding.json, "fields")
    const char* name;
    int kind;  // 0 dtype, 1 size, 2 given, 3 option, 4 group_size
    int a, b;  // tensor (option) index; dim (second tensor)
    const char *yes, *no;
};
struct Check {  // 0: tensor a has `rank` dims; 1: b's second size divides H * D of a
    int kind, a, b;
    const char* name;
    int rank;
};
struct FreeDim {  // a size selection reads only for agreement: the integer's field (-1: none), its addend
    int slot;
    int64_t add;
};
struct KindRow {
    const char* family;
    int family_index;
    const char* const* names;
    const int* slots;  // each tensor's pointer field (-1: the struct has none)
    int n_names;
    const char* const* free;
    const int* free_slots;
    int n_free;
    const char* const* options;
    int n_options;
    int typed;
    const char* what;
    const Rule* rules;
    int n_rules;
    const Check* checks;
    int n_checks;
    const FreeDim (*free_dims)[8];  // per tensor, per dim
};
struct OpArg {
    int role;  // 0 tensor, 1 free integer, 2 option
    int index, optional, is_str;
};
struct OpRow {
    const char* name;
    int n_args;
    OpArg args[kMaxOpArgs];
    int kinds[2];  // without, with the start locations
    struct {
        int index;
        const char* value;
    } fixed[2];
    int n_fixed;
    int allocated[2];
    int n_allocated;
};
struct Renames {  // an op's tensors by its argument names, where the kernels' parameters differ
    const NamePair* pairs;  // {parameter, argument}
    int n;
};
struct Expr {  // mul * product(args[f]) + add
    int64_t mul;
    int n;
    int f[4];
    int64_t add;
};
struct Dim {
    const char* label;
    Expr size, stride;
    int size_slot, stride_slot;  // the integer the dim gives (-1: none)
};
struct Param {
    const char* name;
    int slot, pointer;
    const char* elem;
    int n_dims;
    const Dim* dims;
};
struct KernelRow {
    const char* name;
    int family;
    const Param* params;
    int n_params;
    int group_size;  // a per-token-group FP8 kernel's (0: none)
};

