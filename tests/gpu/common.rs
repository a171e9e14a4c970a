//! Helpers of the GPU suite (tests/gpu.rs) about the machine: the GPU or the reason to skip, the
//! generated folders, the report, and raw bits to and from device buffers.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

use mla_gen::contract::Bounds;
use mla_gen::dtype::Dtype;
use mla_gen::reference::LseBase;
use mla_gen::runtime::{self, DeviceBuffer, Kernel};

/// Say it where a person sees it: libtest captures print!, not direct writes to stderr.
pub fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// The GPU, or `None` with the reason said: the test then skips. Where `MLA_GEN_EXPECT_GPU` is
/// set (the GPU scripts set it), a skip would pass a run that checked nothing, so it panics.
pub fn gpu() -> Option<Arc<CudaContext>> {
    let skip = |why: String| {
        if std::env::var_os("MLA_GEN_EXPECT_GPU").is_some() {
            panic!("MLA_GEN_EXPECT_GPU is set, but {why}");
        }
        say(&format!("SKIPPED GPU test: {why}"));
        None
    };
    if !runtime::driver_present() {
        return skip("no CUDA driver (libcuda.so.1) on this machine; run scripts/gpu-check.sh on a GPU machine".into());
    }
    match CudaContext::new(0) {
        Ok(c) => Some(c),
        Err(e) => skip(format!("CUDA driver present but no usable GPU ({e:?})")),
    }
}

pub fn dir_of(var: Option<&str>) -> Option<PathBuf> {
    match var {
        Some(v) => std::env::var_os(v).map(PathBuf::from),
        // MLA_GEN_GPU_KERNELS: another folder in place of the repo's generated/.
        None if std::env::var_os("MLA_GEN_GPU_KERNELS").is_some() => {
            std::env::var_os("MLA_GEN_GPU_KERNELS").map(PathBuf::from)
        }
        None => {
            let dir = generated_dir();
            // Git holds the manifest only: the images are build outputs (generated/README.md).
            assert!(
                dir.join("kernels").is_dir(),
                "{} has no kernels/: its images are build outputs; build them with scripts/images.sh (or scripts/generate.sh) and, for a GPU machine, carry generated/kernels",
                dir.display()
            );
            Some(dir)
        }
    }
}

/// The repo's generated/: where the tests were built, else (a binary carried to a GPU machine)
/// under the working directory.
pub fn generated_dir() -> PathBuf {
    let in_repo = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/generated"));
    if in_repo.exists() {
        in_repo
    } else {
        PathBuf::from("generated")
    }
}

/// Each kernel's lse base by name, from the variant fields of a folder's manifest.json
/// (`variant.lse_base`, absent for base e), which the typed manifest leaves out.
pub struct LseBases(HashMap<String, LseBase>);

impl LseBases {
    pub fn of(&self, k: &Kernel) -> LseBase {
        self.named(&k.meta.name)
    }
    pub fn named(&self, name: &str) -> LseBase {
        *self.0.get(name).unwrap_or_else(|| {
            panic!("kernel {name} is not in the manifest.json its lse bases were read from")
        })
    }
}

pub fn lse_bases(dir: &Path) -> LseBases {
    let path = dir.join("manifest.json");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let bases = manifest["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            let name = k["name"].as_str().unwrap().to_string();
            let field = k["variant"]["lse_base"].as_str();
            let base = LseBase::from_manifest(field).unwrap_or_else(|| {
                panic!(
                    "{}: kernel {name} has variant.lse_base {field:?}; this suite knows \"e\" and \"2\"",
                    path.display()
                )
            });
            (name, base)
        })
        .collect();
    LseBases(bases)
}

/// Elements per vector access: every stride a tensor takes must be a multiple of it (the
/// contract's `stride_multiple`, equal for all of a kernel's row tensors).
pub fn vec_elems(k: &Kernel) -> usize {
    k.meta
        .params
        .iter()
        .filter_map(|p| p.tensor.as_ref())
        .map(|t| t.stride_multiple as usize)
        .max()
        .unwrap_or(1)
}

/// The bounds a kernel's contract gives its integer parameter `name`, if any.
pub fn bounds_of<'k>(k: &'k Kernel, name: &str) -> Option<&'k Bounds> {
    k.meta
        .params
        .iter()
        .find(|p| p.name == name)?
        .bounds
        .as_ref()
}

/// The most heads a kernel's contract takes: a flat-row specialization (`_flat`) bounds
/// `num_heads` below the heads a block of its general kernel holds; others take any count.
pub fn most_heads(k: &Kernel) -> usize {
    bounds_of(k, "num_heads")
        .and_then(|b| b.max.as_ref()?.parse().ok())
        .unwrap_or(usize::MAX)
}

/// The fewest tokens a kernel's contract takes: the `_flat` twins of outputs in the inputs'
/// dtype need a grid of 128 blocks or more at one head; others take any count.
pub fn fewest_tokens(k: &Kernel) -> usize {
    bounds_of(k, "num_tokens")
        .and_then(|b| b.min.parse().ok())
        .unwrap_or(0)
}

/// MLA_GEN_GPU_SHARD = "i/n" (1 <= i <= n): the merge suite runs the i-th of every n kernels, so
/// n calls together run it whole; unset: (1, 1).
pub fn shard() -> (usize, usize) {
    let Some(v) = std::env::var_os("MLA_GEN_GPU_SHARD") else {
        return (1, 1);
    };
    let v = v.to_string_lossy();
    let parsed = v
        .split_once('/')
        .and_then(|(i, n)| Some((i.trim().parse().ok()?, n.trim().parse().ok()?)));
    match parsed {
        Some((i, n)) if 1 <= i && i <= n => (i, n),
        _ => panic!("MLA_GEN_GPU_SHARD={v}: expected i/n with 1 <= i <= n, e.g. 2/3"),
    }
}

pub fn report(line: &str) {
    say(line);
    if let Some(p) = std::env::var_os("MLA_GEN_GPU_REPORT") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

pub fn upload_bits(
    stream: &Arc<CudaStream>,
    dtype: Dtype,
    bits: &[u32],
) -> (Box<dyn std::any::Any>, DeviceBuffer) {
    let (holder, ptr): (Box<dyn std::any::Any>, u64) = match dtype {
        Dtype::F32 => {
            let s: CudaSlice<u32> = stream.clone_htod(bits).unwrap();
            let p = raw(&s, stream);
            (Box::new(s), p)
        }
        Dtype::Fp8E4m3 => {
            let bytes: Vec<u8> = bits.iter().map(|&b| b as u8).collect();
            let s: CudaSlice<u8> = stream.clone_htod(&bytes).unwrap();
            let p = raw(&s, stream);
            (Box::new(s), p)
        }
        _ => {
            let narrow: Vec<u16> = bits.iter().map(|&b| b as u16).collect();
            let s: CudaSlice<u16> = stream.clone_htod(&narrow).unwrap();
            let p = raw(&s, stream);
            (Box::new(s), p)
        }
    };
    (
        holder,
        DeviceBuffer {
            ptr,
            len: bits.len(),
            dtype,
        },
    )
}

/// A float32 buffer (an lse array, FP8 scales) of `len` elements at `ptr`.
pub fn f32_buffer(ptr: u64, len: usize) -> DeviceBuffer {
    DeviceBuffer {
        ptr,
        len,
        dtype: Dtype::F32,
    }
}

pub fn raw<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    use cudarc::driver::DevicePtr;
    let (p, _sync) = s.device_ptr(stream);
    p
}

pub fn download_bits(
    stream: &Arc<CudaStream>,
    dtype: Dtype,
    holder: &dyn std::any::Any,
) -> Vec<u32> {
    match dtype {
        Dtype::F32 => stream
            .clone_dtoh(holder.downcast_ref::<CudaSlice<u32>>().unwrap())
            .unwrap(),
        Dtype::Fp8E4m3 => stream
            .clone_dtoh(holder.downcast_ref::<CudaSlice<u8>>().unwrap())
            .unwrap()
            .into_iter()
            .map(u32::from)
            .collect(),
        _ => stream
            .clone_dtoh(holder.downcast_ref::<CudaSlice<u16>>().unwrap())
            .unwrap()
            .into_iter()
            .map(u32::from)
            .collect(),
    }
}
