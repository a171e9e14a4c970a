//! The one table that maps each element type to its spellings: spec/file name, C type in the
//! generated CUDA, Rust type in bindings, torch name in the Python drop-in.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Dtype {
    F32,
    F16,
    Bf16,
    /// FP8 e4m3 (OCP "e4m3fn"), stored as its 8-bit code: an output type only.
    #[serde(rename = "fp8_e4m3")]
    Fp8E4m3,
    /// int32 (request start locations).
    I32,
    /// One byte (per-token masks).
    U8,
}

#[non_exhaustive]
pub struct DtypeInfo {
    pub dtype: Dtype,
    /// Spelling in specs, kernel names and file names.
    pub name: &'static str,
    /// Storage type in generated CUDA (typedefs from the template prelude).
    pub c_type: &'static str,
    /// Element type in Rust bindings.
    pub rust_type: &'static str,
    /// `torch.dtype` attribute name in the Python drop-in.
    pub torch_name: &'static str,
    pub size_bytes: u32,
    /// Allowed as a spec's `dtype` (the inputs' type); fp8 is an output kind only.
    pub input: bool,
}

pub const DTYPES: [DtypeInfo; 6] = [
    DtypeInfo {
        dtype: Dtype::F32,
        name: "f32",
        c_type: "float",
        rust_type: "f32",
        torch_name: "float32",
        size_bytes: 4,
        input: true,
    },
    DtypeInfo {
        dtype: Dtype::F16,
        name: "f16",
        c_type: "mla_f16",
        rust_type: "half::f16",
        torch_name: "float16",
        size_bytes: 2,
        input: true,
    },
    DtypeInfo {
        dtype: Dtype::Bf16,
        name: "bf16",
        c_type: "mla_bf16",
        rust_type: "half::bf16",
        torch_name: "bfloat16",
        size_bytes: 2,
        input: true,
    },
    DtypeInfo {
        dtype: Dtype::Fp8E4m3,
        name: "fp8_e4m3",
        c_type: "mla_fp8_e4m3",
        rust_type: "u8",
        torch_name: "float8_e4m3fn",
        size_bytes: 1,
        input: false,
    },
    DtypeInfo {
        dtype: Dtype::I32,
        name: "i32",
        c_type: "int",
        rust_type: "i32",
        torch_name: "int32",
        size_bytes: 4,
        input: false,
    },
    DtypeInfo {
        dtype: Dtype::U8,
        name: "u8",
        c_type: "unsigned char",
        rust_type: "u8",
        torch_name: "uint8",
        size_bytes: 1,
        input: false,
    },
];

impl Dtype {
    pub fn info(self) -> &'static DtypeInfo {
        // DTYPES is ordered like the enum; the unit test below keeps them in step.
        &DTYPES[self as usize]
    }
    pub fn name(self) -> &'static str {
        self.info().name
    }
    pub fn size_bytes(self) -> u32 {
        self.info().size_bytes
    }
    pub fn from_name(name: &str) -> Option<Dtype> {
        DTYPES.iter().find(|d| d.name == name).map(|d| d.dtype)
    }
    /// A spec's input dtype by name (fp8 is not one).
    pub fn input_from_name(name: &str) -> Option<Dtype> {
        DTYPES
            .iter()
            .find(|d| d.input && d.name == name)
            .map(|d| d.dtype)
    }
    /// The names a spec's `dtype` may take.
    pub fn allowed_names() -> Vec<&'static str> {
        DTYPES.iter().filter(|d| d.input).map(|d| d.name).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_through_its_name() {
        for d in [
            Dtype::F32,
            Dtype::F16,
            Dtype::Bf16,
            Dtype::Fp8E4m3,
            Dtype::I32,
            Dtype::U8,
        ] {
            assert_eq!(Dtype::from_name(d.name()), Some(d));
        }
        assert_eq!(Dtype::input_from_name("fp8_e4m3"), None);
        assert_eq!(Dtype::allowed_names(), ["f32", "f16", "bf16"]);
        assert_eq!(Dtype::from_name("fp16"), None);
        for (i, row) in DTYPES.iter().enumerate() {
            assert_eq!(row.dtype as usize, i, "DTYPES must follow the enum order");
        }
    }
}
