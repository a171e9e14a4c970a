//! The cases of tests/faults.rs, run in one child process on the stub driver: each damages a
//! copy of a generated folder (or tells the stub to fail), asserts the error the runtime gives,
//! and then that a good load and launch still work.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::driver::CudaContext;
use mla_gen::runtime::{Runtime, RuntimeError};

#[path = "../launch_validation/common.rs"]
mod args;

const KERNEL: &str = "merge_attn_states_bf16_d128_thr_lse";
const CUBIN: &str = "kernels/merge_attn_states_bf16_d128_thr_lse.sm_90.cubin";
const PTX: &str = "kernels/merge_attn_states_bf16_d128_thr_lse.sm_90.ptx";
const KERNELS: i32 = 6; // the spec's kernel, its size rule's and their two dense specializations each
const PARAMS: i32 = 15;
const FIX: &str = "mla-gen generate SPEC --out DIR";

const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;
const CUDA_ERROR_ILLEGAL_ADDRESS: i32 = 700;
const CUDA_ERROR_LAUNCH_FAILED: i32 = 719;

/// The stub's controls (tests/c/libcuda_module_stub.c), from the libcuda.so.1 cudarc loaded.
struct Stub(libloading::Library);

impl Stub {
    fn open() -> Stub {
        // SAFETY: the stub library has no initializers; the child's LD_LIBRARY_PATH finds it.
        Stub(unsafe { libloading::Library::new("libcuda.so.1") }.unwrap())
    }
    fn set(&self, name: &str, value: i32) {
        // SAFETY: every stub_set_* / stub_fail_launch is `void f(int)`.
        unsafe {
            self.0
                .get::<unsafe extern "C" fn(i32)>(name.as_bytes())
                .unwrap()(value)
        }
    }
    fn fail_load(&self, after: i32, result: i32) {
        // SAFETY: `void stub_fail_load(int, int)`.
        unsafe {
            self.0
                .get::<unsafe extern "C" fn(i32, i32)>(b"stub_fail_load")
                .unwrap()(after, result)
        }
    }
    fn count(&self, name: &str) -> i32 {
        // SAFETY: every counter is `int f(void)`.
        unsafe {
            self.0
                .get::<unsafe extern "C" fn() -> i32>(name.as_bytes())
                .unwrap()()
        }
    }
    fn loads(&self) -> i32 {
        self.count("stub_loads")
    }
    fn live(&self) -> i32 {
        self.count("stub_live")
    }
}

/// A copy of the generated folder to damage.
fn copy_of(folder: &Path, into: &Path) -> PathBuf {
    let dst = into.join(format!("copy{}", std::fs::read_dir(into).unwrap().count()));
    std::fs::create_dir_all(dst.join("kernels")).unwrap();
    for f in ["manifest.json"].into_iter().map(String::from).chain(
        std::fs::read_dir(folder.join("kernels"))
            .unwrap()
            .map(|e| format!("kernels/{}", e.unwrap().file_name().to_string_lossy())),
    ) {
        std::fs::copy(folder.join(&f), dst.join(&f)).unwrap();
    }
    dst
}

fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut m);
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

/// Every image entry (ptx, cubin) of every kernel.
fn each_image(m: &mut serde_json::Value, mut f: impl FnMut(&mut serde_json::Value)) {
    for k in m["kernels"].as_array_mut().unwrap() {
        for a in k["archs"].as_array_mut().unwrap() {
            for kind in ["ptx", "cubin"] {
                if a.get(kind).is_some_and(|v| !v.is_null()) {
                    f(&mut a[kind]);
                }
            }
        }
    }
}

/// Load `dir`: the error's text, which must name `needles`, with the driver handed no image.
fn refused(ctx: &Arc<CudaContext>, stub: &Stub, dir: &Path, needles: &[&str]) -> RuntimeError {
    let before = stub.loads();
    let e = Runtime::load(ctx.clone(), dir)
        .err()
        .unwrap_or_else(|| panic!("{} loaded", dir.display()));
    let text = e.to_string();
    println!("refused: {text}");
    for n in needles {
        assert!(text.contains(n), "{n:?} missing from: {text}");
    }
    assert_eq!(stub.loads(), before, "the driver saw an image: {text}");
    assert_eq!(stub.live(), 0, "modules left loaded after: {text}");
    e
}

/// The process still works: the good folder loads and a launch runs.
fn still_works(ctx: &Arc<CudaContext>, stub: &Stub, good: &Path) {
    let rt = Runtime::load(ctx.clone(), good).expect("a good load after a fault");
    launch(ctx, &rt).expect("a good launch after a fault");
    drop(rt);
    assert_eq!(stub.live(), 0);
}

fn launch(ctx: &Arc<CudaContext>, rt: &Runtime) -> Result<(), RuntimeError> {
    let k = rt.kernel(KERNEL).unwrap();
    let stream = ctx.default_stream();
    // SAFETY: the stub driver touches no memory; the addresses are only checked.
    unsafe { k.launch(&stream, &args::good().args()) }
}

#[test]
#[ignore = "run by the_runtime_survives_every_fault_on_the_stub_driver, on the stub driver"]
fn every_fault_in_one_process() {
    let Some(good) = std::env::var_os(super::CHILD_FOLDER).map(PathBuf::from) else {
        eprintln!("skipped: only the_runtime_survives_every_fault_on_the_stub_driver runs this");
        return;
    };
    let stub = Stub::open();
    let tmp = tempfile::tempdir().unwrap();
    let ctx = CudaContext::new(0).unwrap();
    stub.set("stub_set_params", PARAMS);

    // A good folder: every kernel loaded once, launched, unloaded with the runtime.
    let rt = Runtime::load(ctx.clone(), &good).unwrap();
    assert_eq!((stub.loads(), stub.live()), (KERNELS, KERNELS));
    launch(&ctx, &rt).unwrap();
    assert_eq!(stub.count("stub_launches"), 1);
    // A kernel the folder lacks: named with the folder's manifest and how to add it.
    let text = rt
        .require("merge_attn_states_bf16_d96")
        .err()
        .unwrap()
        .to_string();
    for n in [
        "merge_attn_states_bf16_d96",
        &good.join("manifest.json").display().to_string(),
        "include_default = true",
        "mla-gen generate SPEC --out DIR",
    ] {
        assert!(text.contains(n), "{n:?} missing from: {text}");
    }
    drop(rt);
    still_works(&ctx, &stub, &good);

    images(&ctx, &stub, &good, tmp.path());
    manifests(&ctx, &stub, &good, tmp.path());
    archs(&ctx, &stub, &good, tmp.path());
    contracts(&ctx, &stub, &good);
    driver_failures(&ctx, &stub, &good);
    threads(&ctx, &stub, &good);
    embedded(&ctx, &stub, &good);
    println!("{}", super::ALL_PASSED);
}

/// Truncated, bit-flipped, zero-length and missing CUBIN and PTX.
fn images(ctx: &Arc<CudaContext>, stub: &Stub, good: &Path, tmp: &Path) {
    let cubin = std::fs::read(good.join(CUBIN)).unwrap();
    let want = format!("{} bytes", cubin.len());
    let damaged: [(&str, Vec<u8>); 3] = [
        ("truncated", cubin[..cubin.len() / 2].to_vec()),
        ("bit-flipped", {
            let mut b = cubin.clone();
            b[cubin.len() / 3] ^= 0x10;
            b
        }),
        ("zero-length", Vec::new()),
    ];
    for (what, bytes) in damaged {
        let dir = copy_of(good, tmp);
        std::fs::write(dir.join(CUBIN), &bytes).unwrap();
        let e = refused(ctx, stub, &dir, &[CUBIN, KERNEL, &want, FIX]);
        assert!(
            matches!(&e, RuntimeError::ImageMismatch { differs, .. } if differs.found_bytes == bytes.len() as u64),
            "{what}: {e:?}"
        );
        still_works(ctx, stub, good);
    }
    let dir = copy_of(good, tmp);
    std::fs::remove_file(dir.join(CUBIN)).unwrap();
    let e = refused(ctx, stub, &dir, &[CUBIN, KERNEL, "incomplete", FIX]);
    assert!(matches!(e, RuntimeError::MissingImage { .. }), "{e:?}");
    still_works(ctx, stub, good);

    // A device with no CUBIN of its major (sm_100 here) JITs the PTX, checked the same way.
    stub.set("stub_set_cc", 100);
    let rt = Runtime::load(ctx.clone(), good).expect("PTX JIT on sm_100");
    assert!(rt.kernel(KERNEL).unwrap().loaded_from.ends_with(".ptx"));
    drop(rt);
    let dir = copy_of(good, tmp);
    let ptx = std::fs::read(good.join(PTX)).unwrap();
    std::fs::write(dir.join(PTX), &ptx[..ptx.len() - 100]).unwrap();
    refused(ctx, stub, &dir, &[PTX, KERNEL, FIX]);
    std::fs::remove_file(dir.join(PTX)).unwrap();
    refused(ctx, stub, &dir, &[PTX, "incomplete"]);
    stub.set("stub_set_cc", 90);
    still_works(ctx, stub, good);
}

/// A truncated manifest, one from a newer schema, one naming files outside its folder, one
/// recording no hashes.
fn manifests(ctx: &Arc<CudaContext>, stub: &Stub, good: &Path, tmp: &Path) {
    let dir = copy_of(good, tmp);
    let text = std::fs::read(dir.join("manifest.json")).unwrap();
    std::fs::write(dir.join("manifest.json"), &text[..text.len() / 2]).unwrap();
    refused(ctx, stub, &dir, &["manifest.json", "ends early", FIX]);

    let dir = copy_of(good, tmp);
    edit_manifest(&dir, |m| m["schema_version"] = 99.into());
    refused(ctx, stub, &dir, &["schema_version 99", "upgrade mla-gen"]);

    for outside in [
        "../outside.cubin",
        "/etc/passwd",
        "kernels/../../x.cubin",
        "",
    ] {
        let dir = copy_of(good, tmp);
        edit_manifest(&dir, |m| {
            m["kernels"][0]["archs"][0]["cubin"]["file"] = outside.into()
        });
        refused(ctx, stub, &dir, &["not a path inside the folder"]);
    }

    let dir = copy_of(good, tmp);
    edit_manifest(&dir, |m| {
        each_image(m, |f| {
            f.as_object_mut().unwrap().remove("sha256");
        })
    });
    refused(ctx, stub, &dir, &["(none recorded)", FIX]);
    still_works(ctx, stub, good);
}

/// A folder for other archs only, and PTX newer than the driver.
fn archs(ctx: &Arc<CudaContext>, stub: &Stub, good: &Path, tmp: &Path) {
    // sm_120 only (its CUBIN, no PTX), on an sm_90 device: the error names both.
    let dir = copy_of(good, tmp);
    edit_manifest(&dir, |m| {
        for k in m["kernels"].as_array_mut().unwrap() {
            k["archs"][0]["arch"] = "sm_120".into();
            k["archs"][0]["ptx"] = serde_json::Value::Null;
        }
    });
    refused(ctx, stub, &dir, &["sm_90", "archs: sm_120", "arch"]);

    // PTX of ISA 9.5 (NVRTC 13.5), consistently recorded, on a 13.0 driver that JITs it.
    let dir = copy_of(good, tmp);
    let ptx = std::fs::read_to_string(dir.join(PTX)).unwrap();
    let newer = ptx.replacen(".version 9.0", ".version 9.5", 1);
    assert_ne!(ptx, newer, "the PTX states .version 9.0");
    std::fs::write(dir.join(PTX), &newer).unwrap();
    let sha = mla_gen::gen::sha256_hex(newer.as_bytes());
    edit_manifest(&dir, |m| {
        m["nvrtc"]["ptx_isa"] = "9.5".into();
        m["nvrtc"]["release"] = "13.5".into();
        m["nvrtc"]["oldest_driver_cuda"] = "13.5".into();
        m["kernels"][0]["archs"][0]["ptx"]["sha256"] = sha.clone().into();
        m["kernels"][0]["archs"][0]["ptx"]["bytes"] = newer.len().into();
    });
    stub.set("stub_set_cc", 100);
    let e = Runtime::load(ctx.clone(), &dir).err().unwrap();
    let text = e.to_string();
    assert!(matches!(e, RuntimeError::PtxTooNew { .. }), "{e:?}");
    for n in ["9.5", "CUDA 13.5", "CUDA 13.0", "13.0.88"] {
        assert!(text.contains(n), "{n:?} missing from: {text}");
    }
    assert_eq!(stub.live(), 0);
    stub.set("stub_set_cc", 90);
    still_works(ctx, stub, good);
}

/// An image whose parameters are not the contract's, asked of a driver with and without
/// cuFuncGetParamCount, and a driver that cannot say.
fn contracts(ctx: &Arc<CudaContext>, stub: &Stub, good: &Path) {
    for counts in [0, 1] {
        stub.set("stub_set_counts", counts);
        for (params, needle) in [
            (PARAMS - 1, "takes 14 parameters, the contract 15"),
            (PARAMS + 1, "more than the contract's 15"),
        ] {
            stub.set("stub_set_params", params);
            let e = Runtime::load(ctx.clone(), good).err().unwrap();
            assert!(matches!(e, RuntimeError::ContractMismatch { .. }), "{e:?}");
            let text = e.to_string();
            assert!(text.contains(needle) && text.contains(KERNEL), "{text}");
            assert_eq!(stub.live(), 0, "{text}");
        }
        // A good load: without the count, one failing query a kernel (the index past the
        // contract's count, which compute-sanitizer reports); with it, none.
        stub.set("stub_set_params", PARAMS);
        let failed = stub.count("stub_failed_queries");
        still_works(ctx, stub, good);
        let expected = if counts == 1 { 0 } else { KERNELS };
        assert_eq!(
            stub.count("stub_failed_queries") - failed,
            expected,
            "counts = {counts}"
        );
    }
    stub.set("stub_set_counts", 0);
    // A driver older than 12.4 cannot tell: the load goes on.
    stub.set("stub_set_params", -1);
    still_works(ctx, stub, good);
    stub.set("stub_set_params", PARAMS);
}

/// Out of memory in a load, a failed launch, a sticky error: errors naming the kernel and the
/// driver's error, nothing left loaded, and the next call works once the cause is gone.
fn driver_failures(ctx: &Arc<CudaContext>, stub: &Stub, good: &Path) {
    stub.fail_load(2, CUDA_ERROR_OUT_OF_MEMORY); // the third module load
    let e = Runtime::load(ctx.clone(), good).err().unwrap();
    let text = e.to_string();
    assert!(matches!(e, RuntimeError::Load { .. }), "{e:?}");
    for n in [
        "CUDA_ERROR_OUT_OF_MEMORY",
        "cuModuleLoadData",
        "merge_attn_states_bf16",
    ] {
        assert!(text.contains(n), "{n:?} missing from: {text}");
    }
    assert_eq!(stub.live(), 0, "the two loaded modules were not unloaded");
    still_works(ctx, stub, good);

    let rt = Runtime::load(ctx.clone(), good).unwrap();
    stub.set("stub_fail_launch", CUDA_ERROR_LAUNCH_FAILED);
    let text = launch(ctx, &rt).unwrap_err().to_string();
    assert!(
        text.contains(KERNEL) && text.contains("CUDA_ERROR_LAUNCH_FAILED"),
        "{text}"
    );
    launch(ctx, &rt).expect("the launch after a failed one");

    // A kernel elsewhere faulted: the context answers every call with the sticky error.
    stub.set("stub_set_sticky", CUDA_ERROR_ILLEGAL_ADDRESS);
    for _ in 0..3 {
        let text = launch(ctx, &rt).unwrap_err().to_string();
        assert!(
            text.contains(KERNEL)
                && text.contains("CUDA_ERROR_ILLEGAL_ADDRESS")
                && text.contains("recreate the context"),
            "{text}"
        );
    }
    drop(rt);
    let text = Runtime::load(ctx.clone(), good).err().unwrap().to_string();
    assert!(
        text.contains("CUDA_ERROR_ILLEGAL_ADDRESS") && text.contains("sticky"),
        "{text}"
    );
    assert_eq!(stub.live(), 0);
    stub.set("stub_set_sticky", 0); // a new context
    still_works(ctx, stub, good);
}

/// 32 threads loading at once, then 32 launching through one runtime.
fn threads(ctx: &Arc<CudaContext>, stub: &Stub, good: &Path) {
    let before = stub.loads();
    let runtimes: Vec<Runtime> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..32)
            .map(|_| s.spawn(|| Runtime::load(ctx.clone(), good).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Each runtime loads each kernel once.
    assert_eq!(stub.loads() - before, 32 * KERNELS);
    drop(runtimes);
    assert_eq!(stub.live(), 0);
    let rt = Runtime::load(ctx.clone(), good).unwrap();
    let launches = stub.count("stub_launches");
    std::thread::scope(|s| {
        for _ in 0..32 {
            s.spawn(|| launch(ctx, &rt).unwrap());
        }
    });
    assert_eq!(stub.count("stub_launches") - launches, 32);
    assert_eq!(
        stub.loads() - before,
        33 * KERNELS,
        "a launch loaded a module"
    );
}

/// Images embedded in a binary are checked as files are.
fn embedded(ctx: &Arc<CudaContext>, stub: &Stub, good: &Path) {
    let manifest = std::fs::read_to_string(good.join("manifest.json")).unwrap();
    let names: Vec<String> = std::fs::read_dir(good.join("kernels"))
        .unwrap()
        .map(|e| format!("kernels/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    let mut bytes: Vec<Vec<u8>> = names
        .iter()
        .map(|n| std::fs::read(good.join(n)).unwrap())
        .collect();
    let files = |bytes: &[Vec<u8>]| -> Vec<(String, Vec<u8>)> {
        names.iter().cloned().zip(bytes.iter().cloned()).collect()
    };
    let load = |files: &[(String, Vec<u8>)]| {
        let refs: Vec<(&str, &[u8])> = files
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_slice()))
            .collect();
        Runtime::from_embedded(ctx.clone(), &manifest, &refs)
    };
    load(&files(&bytes)).expect("the embedded folder loads");
    let i = names.iter().position(|n| n == CUBIN).unwrap();
    bytes[i].truncate(100);
    let before = stub.loads();
    let text = load(&files(&bytes)).err().unwrap().to_string();
    assert!(text.contains(CUBIN) && text.contains("100 bytes"), "{text}");
    assert_eq!(stub.loads(), before);
    assert_eq!(stub.live(), 0);
}
