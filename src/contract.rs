//! The argument contract of a kernel: what a caller must satisfy for every parameter, as data.
//!
//! The generator (`gen::abi`) writes one [`Contract`] per kernel into `manifest.json`; every host
//! (the Rust runtime through [`crate::host::check`], the generated C launcher, the Python
//! package) reads it back and applies the same checks in the same order with the same messages
//! (docs/MANIFEST.md). Serde only: a runtime-only build reads it without the code generator.
//!
//! Sizes and strides are small expressions over the kernel's integer parameters and
//! constants: `num_tokens`, `num_heads*4`, `num_requests+1`, `128`. Grammar:
//! `factor ('*' factor)* ('+' integer)?`, a factor being an integer or a name.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The manifest's file name in a generated folder.
pub const MANIFEST: &str = "manifest.json";

/// Version of the manifest layout; hosts refuse a manifest of another major version.
pub const SCHEMA_VERSION: u32 = 2;

/// What a kernel does with a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Role {
    /// A buffer it only reads.
    Read,
    /// A buffer it writes (every element of its extent; callers may pass it uninitialized).
    Write,
    /// A buffer it reads, then writes (an in-place state).
    ReadWrite,
    /// A 64-bit integer passed by value.
    Value,
}

impl Role {
    /// The kernel writes through it: it may share memory with no other argument.
    pub fn writes(self) -> bool {
        matches!(self, Role::Write | Role::ReadWrite)
    }
}

/// How a parameter is passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ParamKind {
    /// Device pointer to `elem` values.
    Pointer,
    /// 64-bit signed integer passed by value.
    I64,
}

/// One dimension of a tensor: its label in messages, its size and its stride (elements).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Dim {
    pub label: String,
    pub size: String,
    pub stride: String,
}

/// The memory a pointer parameter must cover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Tensor {
    /// Outermost first. Element (i0, i1, ...) sits at sum(i_k * stride_k); no dims = one element.
    pub dims: Vec<Dim>,
    /// The pointer's required alignment in bytes (the kernel's vector access).
    pub align_bytes: u32,
    /// Strides given by integer parameters must be multiples of this many elements.
    pub stride_multiple: u32,
    /// No two elements may share an address (every buffer the kernel writes).
    pub distinct: bool,
}

/// The range of an integer parameter, and its value when a caller leaves it out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Bounds {
    pub min: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    /// Absent: the caller must give it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

/// One kernel parameter, in signature order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Param {
    pub name: String,
    /// Spelling in the generated CUDA signature.
    pub c_type: String,
    pub kind: ParamKind,
    pub role: Role,
    /// Element type behind a pointer: f32, f16, bf16, fp8_e4m3, i32 or u8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elem: Option<String>,
    /// Bytes per element behind a pointer.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub elem_bytes: u32,
    /// Null is allowed and means "skip" (the tensor is then not checked).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nullable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor: Option<Tensor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bounds: Option<Bounds>,
    pub doc: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// How the grid follows from the integer arguments: `ceil(dim / per_block)` per axis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct GridAxis {
    pub dim: String,
    pub per_block: u32,
    /// CUDA's limit on this axis.
    pub limit: u32,
}

/// The launch: block size, shared memory and the grid rule. A zero on any axis launches nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LaunchRule {
    pub block_threads: u32,
    pub shared_mem_bytes: u32,
    pub grid_x: GridAxis,
    pub grid_y: GridAxis,
    /// The kernel waits for the previous kernel on its stream (`griddepcontrol.wait`): launch it
    /// with programmatic stream serialization where the device's compute capability is 9.0 or
    /// newer, plainly elsewhere. Absent: false (manifests from before the key read the same).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pdl: bool,
    /// Launches with fewer rows run other kernels (docs/MANIFEST.md, "Size rules"); absent:
    /// every launch runs this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_rule: Option<SizeRule>,
    /// Kernels that serve some of this kernel's launches faster, with the same parameters: a
    /// host launches the first of them whose contract accepts the call's arguments, after the
    /// size rule chose this kernel (docs/MANIFEST.md, "Specializations"). Absent: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub specializations: Vec<String>,
}

/// A limit on the integer arguments beyond their own bounds: `expr` (a size expression over
/// them) at most `max`; `why` says what in the kernel needs it (messages quote it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Limit {
    pub expr: String,
    pub max: u64,
    pub why: String,
}

/// A size rule as hosts apply it: rows = the product of the two grid dimensions' integers
/// (tokens x heads); the first range whose bound exceeds them names the kernel to launch instead,
/// with the same arguments; past every bound, this kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SizeRule {
    pub rows: [String; 2],
    pub ranges: Vec<SizeRuleRange>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SizeRuleRange {
    pub below_rows: u64,
    pub kernel: String,
}

/// A `[T, H, D]` tensor view in elements: row (t, h) starts at `t*token_stride + h*head_stride`.
/// Every `[T, H, D]` tensor of every family passes its strides as the two parameters
/// `<tensor>_token_stride` and `<tensor>_head_stride` ([`strides_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub token_stride: usize,
    pub head_stride: usize,
}

impl Layout {
    pub fn contiguous(heads: usize, head_size: usize) -> Layout {
        Layout {
            token_stride: heads * head_size,
            head_stride: head_size,
        }
    }
    pub fn row(&self, t: usize, h: usize) -> usize {
        t * self.token_stride + h * self.head_stride
    }
}

/// The stride parameters of each `[T, H, D]` tensor the kernels take: (token stride, head stride).
pub mod strides_of {
    pub const OUTPUT: (&str, &str) = ("output_token_stride", "output_head_stride");
    pub const PREFIX: (&str, &str) = ("prefix_token_stride", "prefix_head_stride");
    pub const SUFFIX: (&str, &str) = ("suffix_token_stride", "suffix_head_stride");
    pub const STATE: (&str, &str) = ("state_token_stride", "state_head_stride");
    pub const OTHER: (&str, &str) = ("other_token_stride", "other_head_stride");
}

/// Everything a caller must satisfy, and how the kernel is launched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Contract {
    pub params: Vec<Param>,
    /// Names fixed when the kernel was generated (head_size, a compile-time num_states, the
    /// threshold of a kernel without one): a caller may pass them, and must pass these values.
    pub constants: BTreeMap<String, String>,
    /// Checked after every parameter's own bounds; absent: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<Limit>,
    pub launch: LaunchRule,
    /// What selects this kernel beyond its parameters (docs/MANIFEST.md, "Selection"): option
    /// name -> value, each of which a call must state alike; absent: none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub select: BTreeMap<String, String>,
}

/// A parsed size or stride expression: `mul * product(factors) + add` (`host::check` resolves
/// the names to parameter indexes once, and evaluates that).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expr {
    pub mul: i64,
    /// Names of integer parameters or constants.
    pub factors: Vec<String>,
    pub add: i64,
}

impl Expr {
    pub fn parse(text: &str) -> Result<Expr, String> {
        let bad = || format!("`{text}` is not a size expression (factor*factor...+integer)");
        let (product, add) = match text.split_once('+') {
            Some((p, a)) => (p, a.trim().parse::<i64>().map_err(|_| bad())?),
            None => (text, 0),
        };
        let mut e = Expr {
            mul: 1,
            factors: Vec::new(),
            add,
        };
        for f in product.split('*') {
            let f = f.trim();
            if f.is_empty() {
                return Err(bad());
            }
            if let Ok(n) = f.parse::<i64>() {
                e.mul = e.mul.checked_mul(n).ok_or_else(bad)?;
            } else if f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                e.factors.push(f.to_string());
            } else {
                return Err(bad());
            }
        }
        Ok(e)
    }
}
