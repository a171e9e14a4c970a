//! `manifest.json` as every host in Rust reads it (docs/MANIFEST.md): per kernel its name,
//! variant, argument contract ([`crate::contract`]) and files, and the one artifact rule that
//! picks a kernel's file for a device. Reading needs no GPU and no driver (serde only).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::constants::TOOL_VERSION;
use crate::contract::{Contract, LaunchRule, Limit, Param, SCHEMA_VERSION};
use crate::dtype::Dtype;
use crate::error::{ImageMismatch, ManifestError, REGENERATE};
use crate::host::check::Plan;
use crate::variant::{Arch, Family, Fp8Group, LseLayout, OutputKind, Schedule};

/// The manifest: the NVRTC that made the files and every kernel.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct ManifestView {
    pub schema_version: u32,
    pub nvrtc: NvrtcView,
    pub kernels: Vec<KernelView>,
}

#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct NvrtcView {
    pub release: String,
    pub ptx_isa: String,
    pub oldest_driver_cuda: String,
}

/// The options a kernel was generated with (its `variant`), as far as hosts use them.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct VariantView {
    pub family: Family,
    pub dtype: Dtype,
    pub output: OutputKind,
    /// With output "fp8_e4m3_group": group size and UE8M0.
    #[serde(default)]
    pub fp8_group: Option<Fp8Group>,
    pub head_size: u32,
    pub prefix_threshold: bool,
    pub output_lse: bool,
    pub lse_layout: LseLayout,
    pub schedule: Schedule,
    /// The empty-context mask fused in (absent: false).
    #[serde(default)]
    pub mask_empty_context: bool,
    /// A kernel of another's size rule (launched through that one); absent: none.
    #[serde(default)]
    pub rows_below: Option<u64>,
    /// A dense specialization (launched through its general kernel); absent: false.
    #[serde(default)]
    pub dense: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct FileView {
    pub file: String,
    /// Size and sha256 as generated (what `Builder::prebuilt` checks the file against).
    #[serde(default)]
    pub bytes: Option<u64>,
    #[serde(default)]
    pub sha256: Option<String>,
}

impl FileView {
    /// Is the file a path inside the manifest's folder? Relative, not empty, no `..`: a
    /// manifest naming anything else is refused, never followed.
    pub fn inside_folder(file: &str) -> bool {
        !file.is_empty()
            && Path::new(file)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
    }
}

/// Why `bytes` are not the image a manifest records (`bytes`, `sha256`): found and expected
/// size and sha256, or `None` when they are. Where the manifest records neither, nothing can be
/// checked, and that is a mismatch too.
pub fn image_mismatch(
    recorded_bytes: Option<u64>,
    recorded_sha256: Option<&str>,
    bytes: &[u8],
) -> Option<ImageMismatch> {
    let found_sha256 = sha256_hex(bytes);
    let found_bytes = bytes.len() as u64;
    let expected_sha256 = recorded_sha256.unwrap_or("(none recorded)");
    if recorded_bytes == Some(found_bytes) && expected_sha256 == found_sha256 {
        return None;
    }
    Some(ImageMismatch {
        expected_bytes: recorded_bytes,
        found_bytes,
        expected_sha256: expected_sha256.to_string(),
        found_sha256,
    })
}

/// What `bytes` are not, when they are not the kind of image the manifest says: "an ELF CUBIN"
/// (`cubin`) or "PTX text" (no NUL, not empty). The hash may match a manifest that is itself
/// wrong, and the driver must only get what it can parse without reading past the end.
pub fn image_kind_mismatch(cubin: bool, bytes: &[u8]) -> Option<&'static str> {
    if cubin {
        (bytes.len() < 64 || !bytes.starts_with(b"\x7fELF")).then_some("an ELF CUBIN")
    } else {
        (bytes.is_empty() || bytes.contains(&0)).then_some("PTX text")
    }
}

/// SHA-256 (FIPS 180-4) of `data` as lower-case hex. Written out here so that the runtime, which
/// checks every image with it, depends on no hashing crate (it stays a light dependency).
fn sha256_hex(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    // The message, 0x80, zeros to 56 mod 64 bytes, and its length in bits, big-endian.
    let mut tail = Vec::with_capacity(128);
    let whole = data.len() / 64 * 64;
    tail.extend_from_slice(&data[whole..]);
    tail.push(0x80);
    while tail.len() % 64 != 56 {
        tail.push(0);
    }
    tail.extend_from_slice(&((data.len() as u64).wrapping_mul(8)).to_be_bytes());
    for block in data[..whole].chunks_exact(64).chain(tail.chunks_exact(64)) {
        let mut w = [0u32; 64];
        for (t, word) in block.chunks_exact(4).enumerate() {
            w[t] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for t in 16..64 {
            let s0 = w[t - 15].rotate_right(7) ^ w[t - 15].rotate_right(18) ^ (w[t - 15] >> 3);
            let s1 = w[t - 2].rotate_right(17) ^ w[t - 2].rotate_right(19) ^ (w[t - 2] >> 10);
            w[t] = w[t - 16]
                .wrapping_add(s0)
                .wrapping_add(w[t - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for (k, w) in K.iter().zip(w) {
            let t1 = hh
                .wrapping_add(e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25))
                .wrapping_add((e & f) ^ (!e & g))
                .wrapping_add(*k)
                .wrapping_add(w);
            let t2 = (a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22))
                .wrapping_add((a & b) ^ (a & c) ^ (b & c));
            (hh, g, f, e, d, c, b, a) = (g, f, e, d.wrapping_add(t1), c, b, a, t1.wrapping_add(t2));
        }
        for (x, v) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(v);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct ArchView {
    pub arch: String,
    /// Absent where the spec's `ptx = "newest"` left it out.
    #[serde(default)]
    pub ptx: Option<FileView>,
    pub cubin: Option<FileView>,
}

/// One kernel of the manifest: what it is, what it takes, how it is launched, its files.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct KernelView {
    pub name: String,
    /// The family's table name (`merge_attn_states`, ...): what a call selects among.
    pub family: String,
    pub variant: VariantView,
    /// The parameters in signature order, each with its contract.
    pub params: Vec<Param>,
    /// Names fixed at generation, with their value as an expression.
    pub constants: BTreeMap<String, String>,
    /// Limits on the integer arguments beyond their bounds; absent: none.
    #[serde(default)]
    pub limits: Vec<Limit>,
    /// Block size, shared memory and the grid rule (the manifest's other launch fields describe
    /// how the kernel was built; no host needs them).
    pub launch: LaunchRule,
    /// What selects the kernel beyond its parameters; absent: none.
    #[serde(default)]
    pub select: BTreeMap<String, String>,
    pub archs: Vec<ArchView>,
}

/// The file a device loads for a kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Artifact {
    /// Path relative to the manifest's folder.
    pub file: String,
    /// Machine code (true) or PTX the driver compiles (false).
    pub cubin: bool,
    /// Size and sha256 the manifest records (checked before the driver sees the file).
    pub bytes: Option<u64>,
    pub sha256: Option<String>,
}

impl ManifestView {
    /// Parse a manifest; `origin` names it in errors. Another `schema_version` is refused
    /// rather than misread.
    pub fn parse(origin: &Path, text: &[u8]) -> Result<ManifestView, ManifestError> {
        let bad = |detail: String| ManifestError {
            path: origin.to_path_buf(),
            detail,
        };
        #[derive(Deserialize)]
        struct Version {
            schema_version: Option<u32>,
        }
        let version: Version = serde_json::from_slice(text).map_err(|e| {
            let why = if e.is_eof() {
                "it ends early (a truncated or partial copy)"
            } else {
                "it is not JSON"
            };
            bad(format!("not a manifest: {why}: {e}; {REGENERATE}"))
        })?;
        match version.schema_version {
            Some(SCHEMA_VERSION) => {}
            Some(v) if v > SCHEMA_VERSION => {
                return Err(bad(format!(
                    "schema_version {v}, from a newer mla-gen; this mla-gen {TOOL_VERSION} reads schema_version {SCHEMA_VERSION}: upgrade mla-gen, or regenerate the kernels with this one"
                )))
            }
            Some(v) => {
                return Err(bad(format!(
                    "schema_version {v}; this mla-gen {TOOL_VERSION} reads schema_version {SCHEMA_VERSION}: regenerate the kernels with it"
                )))
            }
            None => {
                return Err(bad(format!(
                    "no schema_version (a manifest from before the argument contract); this mla-gen reads schema_version {SCHEMA_VERSION}: regenerate the kernels"
                )))
            }
        }
        // Kernel by kernel, so that an entry this mla-gen cannot read is named.
        #[derive(Deserialize)]
        struct Entries {
            schema_version: u32,
            nvrtc: NvrtcView,
            kernels: Vec<serde_json::Value>,
        }
        let entries: Entries = serde_json::from_slice(text).map_err(|e| bad(e.to_string()))?;
        let mut kernels = Vec::with_capacity(entries.kernels.len());
        for k in entries.kernels {
            let name = k
                .get("name")
                .and_then(|n| n.as_str())
                .unwrap_or("?")
                .to_string();
            kernels.push(serde_json::from_value(k).map_err(|e| {
                bad(format!(
                    "cannot read the entry of kernel {name} ({e}): regenerate the kernels with this mla-gen ({TOOL_VERSION})"
                ))
            })?);
        }
        Ok(ManifestView {
            schema_version: entries.schema_version,
            nvrtc: entries.nvrtc,
            kernels,
        })
    }
}

impl NvrtcView {
    /// The NVRTC a manifest records, whatever its schema version (`mla-gen check` names it
    /// when a folder differs).
    pub fn of(text: &[u8]) -> Option<NvrtcView> {
        #[derive(Deserialize)]
        struct Made {
            nvrtc: NvrtcView,
        }
        serde_json::from_slice::<Made>(text).ok().map(|m| m.nvrtc)
    }
}

impl KernelView {
    /// The argument contract: parameters, constants and launch rule.
    pub fn contract(&self) -> Contract {
        Contract {
            params: self.params.clone(),
            constants: self.constants.clone(),
            limits: self.limits.clone(),
            launch: self.launch.clone(),
            select: self.select.clone(),
        }
    }

    /// The checker of this kernel's launches (names resolved once).
    pub fn plan(&self) -> Result<Plan, ManifestError> {
        Plan::new(&self.name, &self.contract()).map_err(|detail| ManifestError {
            path: "manifest.json".into(),
            detail,
        })
    }

    /// The artifact rule (docs/MANIFEST.md): for compute capability `cc`, the CUBIN of an
    /// `sm_XY` entry of the same major with the largest `XY <= cc` (an arch-specific `sm_XYa`
    /// only when `XY == cc`); else the PTX of the entry with the largest `XY <= cc` among those
    /// that carry PTX and are not arch-specific; else none.
    pub fn artifact(&self, cc: (i32, i32)) -> Option<Artifact> {
        let dev = u32::try_from(cc.0 * 10 + cc.1).ok()?;
        let mut best_cubin: Option<(u32, &FileView)> = None;
        let mut best_ptx: Option<(u32, &FileView)> = None;
        for a in &self.archs {
            let Ok(arch) = Arch::parse(&a.arch) else {
                continue;
            };
            let n = arch.major_minor;
            if let Some(c) = a.cubin.as_ref().filter(|_| arch.real) {
                let compatible = if arch.arch_specific {
                    n == dev
                } else {
                    n / 10 == dev / 10 && n <= dev
                };
                if compatible && best_cubin.is_none_or(|(b, _)| n > b) {
                    best_cubin = Some((n, c));
                }
            }
            if let Some(p) = a.ptx.as_ref().filter(|_| !arch.arch_specific && n <= dev) {
                if best_ptx.is_none_or(|(b, _)| n > b) {
                    best_ptx = Some((n, p));
                }
            }
        }
        let pick = |(_, f): (u32, &FileView), cubin| Artifact {
            file: f.file.clone(),
            cubin,
            bytes: f.bytes,
            sha256: f.sha256.clone(),
        };
        best_cubin
            .map(|c| pick(c, true))
            .or_else(|| best_ptx.map(|p| pick(p, false)))
    }

    /// The kernel's lse layout is `[H, T]`.
    pub fn head_major(&self) -> bool {
        self.variant.lse_layout == LseLayout::HeadMajor
    }

    /// The inputs' element type (always known: a manifest with another is not read).
    pub fn dtype(&self) -> Option<Dtype> {
        Some(self.variant.dtype)
    }

    /// The output's element type.
    pub fn output_dtype(&self) -> Option<Dtype> {
        Some(self.variant.output.dtype(self.variant.dtype))
    }

    /// Every PTX and CUBIN file of the kernel, in manifest order, each with whether it is a
    /// CUBIN (true) or PTX (false).
    pub fn images(&self) -> impl Iterator<Item = (&FileView, bool)> {
        self.archs.iter().flat_map(|a| {
            let ptx = a.ptx.iter().map(|f| (f, false));
            ptx.chain(a.cubin.iter().map(|f| (f, true)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel with `archs`: (arch, has a CUBIN, has a PTX).
    fn kernel_with(archs: &[(&str, bool, bool)]) -> KernelView {
        let archs: Vec<serde_json::Value> = archs
            .iter()
            .map(|(a, cubin, ptx)| {
                let mut v = serde_json::json!({"arch": a});
                if *ptx {
                    v["ptx"] = serde_json::json!({"file": format!("{a}.ptx")});
                }
                if *cubin {
                    v["cubin"] = serde_json::json!({"file": format!("{a}.cubin")});
                }
                v
            })
            .collect();
        let axis = serde_json::json!({"dim": "num_tokens", "per_block": 1, "limit": 1});
        serde_json::from_value(serde_json::json!({
            "name": "k",
            "family": "merge_attn_states",
            "variant": {"family": "merge_attn_states", "dtype": "bf16", "head_size": 128,
                        "output": "same", "prefix_threshold": true, "output_lse": true,
                        "lse_layout": "head_major",
                        "schedule": {"rows_per_thread": 1, "min_blocks_per_sm": 1,
                                     "block_threads": 256, "heads_per_block": 1}},
            "params": [],
            "constants": {},
            "launch": {"block_threads": 256, "shared_mem_bytes": 0,
                       "grid_x": axis, "grid_y": axis},
            "archs": archs,
        }))
        .unwrap()
    }

    fn kernel(archs: &[(&str, bool)]) -> KernelView {
        let all: Vec<(&str, bool, bool)> = archs.iter().map(|&(a, c)| (a, c, true)).collect();
        kernel_with(&all)
    }

    #[test]
    fn a_missing_ptx_is_never_picked() {
        // ptx = "newest": CUBIN for each, PTX for sm_120 alone.
        let k = kernel_with(&[
            ("sm_80", true, false),
            ("sm_90", true, false),
            ("sm_120", true, true),
        ]);
        let pick = |cc| k.artifact(cc).map(|a| a.file);
        assert_eq!(pick((8, 6)).as_deref(), Some("sm_80.cubin"));
        assert_eq!(pick((9, 0)).as_deref(), Some("sm_90.cubin"));
        // No CUBIN of major 10, no PTX at or below 10.0.
        assert_eq!(pick((10, 0)), None);
        assert_eq!(pick((12, 1)).as_deref(), Some("sm_120.cubin"));
        assert_eq!(pick((13, 0)).as_deref(), Some("sm_120.ptx"));
        let kinds: Vec<(&str, bool)> = k.images().map(|(f, c)| (f.file.as_str(), c)).collect();
        assert_eq!(
            kinds,
            [
                ("sm_80.cubin", true),
                ("sm_90.cubin", true),
                ("sm_120.ptx", false),
                ("sm_120.cubin", true)
            ]
        );
    }

    #[test]
    fn the_device_gets_its_cubin_else_the_newest_ptx_it_can_jit() {
        let k = kernel(&[("sm_80", true), ("sm_90", true)]);
        let pick = |cc| k.artifact(cc).map(|a| (a.file, a.cubin));
        assert_eq!(pick((9, 0)), Some(("sm_90.cubin".into(), true)));
        assert_eq!(pick((8, 0)), Some(("sm_80.cubin".into(), true)));
        // sm_86 runs sm_80 machine code (same major, newer minor).
        assert_eq!(pick((8, 6)), Some(("sm_80.cubin".into(), true)));
        // A newer major has no CUBIN here: the newest PTX, JIT-compiled.
        assert_eq!(pick((10, 0)), Some(("sm_90.ptx".into(), false)));
        // Older than every target: nothing.
        assert_eq!(pick((7, 5)), None);
        // Arch-specific targets run only on their own architecture.
        let k = kernel(&[("sm_90a", true), ("compute_80", false)]);
        assert_eq!(k.artifact((9, 0)).unwrap().file, "sm_90a.cubin");
        assert_eq!(k.artifact((10, 0)).unwrap().file, "compute_80.ptx");
    }

    #[test]
    fn only_paths_inside_the_folder_are_followed() {
        assert!(FileView::inside_folder("kernels/k.sm_90.cubin"));
        for outside in [
            "",
            "../k.cubin",
            "kernels/../../k.cubin",
            "/etc/passwd",
            ".",
        ] {
            assert!(!FileView::inside_folder(outside), "{outside:?}");
        }
    }

    #[test]
    fn an_image_matches_only_its_recorded_size_and_sha256() {
        // sha256("abc"), FIPS 180-2's example.
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(image_mismatch(Some(3), Some(abc), b"abc"), None);
        let m = image_mismatch(Some(3), Some(abc), b"abd").unwrap();
        assert_eq!((m.expected_bytes, m.found_bytes), (Some(3), 3));
        assert_ne!(m.found_sha256, abc);
        assert!(image_mismatch(Some(2), Some(abc), b"abc").is_some());
        // Nothing recorded: nothing can be checked, so the image is refused.
        let m = image_mismatch(None, None, b"abc").unwrap();
        assert_eq!(m.found_sha256, abc);
        // The padding's edge cases (55, 56 and 64 bytes: one or two final blocks) and a long
        // input, against the generator's hash (the sha2 crate).
        #[cfg(feature = "codegen")]
        for n in [0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 100_003] {
            let data: Vec<u8> = (0..n).map(|i| (i * 131 % 251) as u8).collect();
            assert_eq!(
                sha256_hex(&data),
                crate::gen::sha256_hex(&data),
                "{n} bytes"
            );
        }
    }

    #[test]
    fn another_schema_version_is_refused_not_misread() {
        let origin = Path::new("m.json");
        let e = ManifestView::parse(origin, br#"{"schema_version": 3}"#).unwrap_err();
        assert!(e.to_string().contains("schema_version 3"), "{e}");
        let e = ManifestView::parse(origin, br#"{"kernels": []}"#).unwrap_err();
        assert!(e.to_string().contains("no schema_version"), "{e}");
        let e = ManifestView::parse(origin, b"").unwrap_err();
        assert!(e.to_string().starts_with("m.json: not a manifest"), "{e}");
        let e = ManifestView::parse(origin, br#"{"schema_version": 99}"#).unwrap_err();
        assert!(e.to_string().contains("upgrade mla-gen"), "{e}");
        let e = ManifestView::parse(origin, br#"{"schema_version": 2, "kern"#).unwrap_err();
        assert!(e.to_string().contains("ends early"), "{e}");
    }
}
