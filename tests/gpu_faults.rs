//! Faults never crash the process (issue #33), the Rust runtime on a real GPU: what the stub
//! driver of tests/faults.rs cannot show. Each test ends in a clear error or a correct merge
//! (checked against the float64 reference by the GPU suite's own case), never a crash or a hang:
//! - a truncated CUBIN in a copy of the folder: refused before the driver sees it;
//! - GPU memory exhausted before the first load: the load works or says out of memory, and after
//!   freeing, the load and a merge are correct;
//! - an illegal address left by another kernel (a test kernel writing to a bad address, in a
//!   child process, as the context is lost): the next merge and the next load report the sticky
//!   error, neither hangs;
//! - `fork()` after the first call: the child's call returns (an error or a launch), the parent's
//!   next merge is correct;
//! - a folder built only for sm_120: the error names its archs and the device's;
//! - a second GPU, where there is one: its own runtime merges correctly, and a kernel of the
//!   first refuses the second's stream.
//!
//! Skips loudly without a GPU. On the GPU machine, from the repository root with generated/'s
//! images present (MLA_GEN_GPU_KERNELS names another folder):
//! `cargo test --release --test gpu_faults -- --nocapture --test-threads=1`.
#![cfg(feature = "cli")]
#![allow(dead_code)] // the GPU suite's helpers, of which these tests use a part

#[path = "gpu/common.rs"]
mod common;
#[path = "gpu/data.rs"]
mod data;
#[path = "gpu/merge_attn_states.rs"]
mod merge_attn_states;

use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{result, CudaContext, CudaSlice};
use mla_gen::dtype::Dtype;
use mla_gen::reference::{Layout, LseBase};
use mla_gen::runtime::{DeviceBuffer, Kernel, MergeArgs, Runtime, RuntimeError};

use common::{dir_of, gpu, raw, say};
use merge_attn_states::run_case;

// A kernel of base-e lse (its name has no `_lse_base2`).
const KERNEL: &str = "merge_attn_states_f32_d128_thr_lse";
/// Set in the child process of the sticky-error test.
const STICKY_CHILD: &str = "MLA_GEN_GPU_FAULTS_STICKY_CHILD";

/// A correct merge by `KERNEL` of `rt` (the GPU suite's case against the reference).
fn merges_correctly(ctx: &Arc<CudaContext>, rt: &Runtime) {
    let k = rt
        .kernel(KERNEL)
        .expect("the folder has the f32 d128 kernel");
    let stream = ctx.default_stream();
    run_case(k, LseBase::E, &stream, 333, 8, Some(200), true, 7, None).expect("a correct merge");
    stream.synchronize().unwrap();
}

/// Device buffers for a merge of `KERNEL` and its arguments, made ahead of a call that must not
/// allocate (in a forked child, in a faulted context).
struct Prepared {
    _buffers: Vec<CudaSlice<f32>>,
    args: mla_gen::runtime::NamedArgs<'static>,
}

fn prepare(stream: &Arc<cudarc::driver::CudaStream>) -> Prepared {
    let (t, h, d) = (64usize, 8usize, 128usize);
    let sizes = [t * h * d, t * h, t * h * d, t * h];
    let buffers: Vec<CudaSlice<f32>> = sizes
        .iter()
        .map(|&n| stream.alloc_zeros(n).unwrap())
        .collect();
    let buf = |i: usize| DeviceBuffer {
        ptr: raw(&buffers[i], stream),
        len: sizes[i],
        dtype: Dtype::F32,
    };
    let l = Layout::contiguous(h, d);
    let args = MergeArgs {
        output: buf(2),
        output_lse: Some(buf(3)),
        prefix: buf(0),
        prefix_lse: buf(1),
        suffix: buf(0),
        suffix_lse: buf(1),
        output_scale: None,
        output_scales: None,
        num_tokens: t,
        num_heads: h,
        output_layout: l,
        prefix_layout: l,
        suffix_layout: l,
        prefill_tokens_with_context: Some(t),
    }
    .args();
    stream.synchronize().unwrap();
    Prepared {
        _buffers: buffers,
        args,
    }
}

/// A copy of the folder with only the files the device loads, plus the manifest.
fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.join("kernels")).unwrap();
    std::fs::copy(from.join("manifest.json"), to.join("manifest.json")).unwrap();
    for e in std::fs::read_dir(from.join("kernels")).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".cubin") || name.ends_with(".ptx") {
            std::fs::copy(e.path(), to.join("kernels").join(name)).unwrap();
        }
    }
}

/// The file the device loads for `KERNEL`.
fn image_of(ctx: &Arc<CudaContext>, dir: &Path) -> String {
    let text = std::fs::read(dir.join("manifest.json")).unwrap();
    let m = mla_gen::runtime::ManifestView::parse(Path::new("manifest.json"), &text).unwrap();
    let k = m.kernels.iter().find(|k| k.name == KERNEL).unwrap();
    k.artifact(ctx.compute_capability().unwrap()).unwrap().file
}

#[test]
fn a_truncated_cubin_is_refused_on_the_gpu_and_the_good_folder_still_merges() {
    let Some(ctx) = gpu() else { return };
    let good = dir_of(None).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad");
    copy_folder(&good, &bad);
    let file = image_of(&ctx, &good);
    let bytes = std::fs::read(bad.join(&file)).unwrap();
    std::fs::write(bad.join(&file), &bytes[..bytes.len() / 2]).unwrap();
    let e = Runtime::load(ctx.clone(), &bad).err().expect("refused");
    say(&format!("truncated: {e}"));
    assert!(matches!(e, RuntimeError::ImageMismatch { .. }), "{e:?}");
    assert!(e.to_string().contains(&file) && e.to_string().contains("mla-gen generate"));
    merges_correctly(&ctx, &Runtime::load(ctx.clone(), &good).unwrap());
}

#[test]
fn exhausted_gpu_memory_at_the_first_load_is_an_error_or_a_load_and_freeing_recovers() {
    let Some(ctx) = gpu() else { return };
    let good = dir_of(None).unwrap();
    let stream = ctx.default_stream();
    let mut held: Vec<CudaSlice<u8>> = Vec::new();
    for chunk in [1usize << 30, 64 << 20, 1 << 20] {
        while let Ok(s) = stream.alloc_zeros::<u8>(chunk) {
            held.push(s);
        }
    }
    say(&format!("exhausted: {} buffers held", held.len()));
    match Runtime::load(ctx.clone(), &good) {
        Ok(_) => say("exhausted: the load still fit"),
        Err(e) => {
            // Clean: a driver error naming the kernel, with the way out where it is memory.
            say(&format!("exhausted: {e}"));
            let text = e.to_string();
            assert!(
                matches!(e, RuntimeError::Load { .. }) && text.contains("merge_"),
                "{text}"
            );
            if text.contains("CUDA_ERROR_OUT_OF_MEMORY") {
                assert!(text.contains("free some"), "{text}");
            }
        }
    }
    drop(held);
    stream.synchronize().unwrap();
    merges_correctly(&ctx, &Runtime::load(ctx.clone(), &good).unwrap());
}

/// A kernel that stores to the address it is given.
const FAULT_PTX: &str = ".version 7.0\n.target sm_50\n.address_size 64\n\
.visible .entry fault(.param .u64 p)\n{\n.reg .u64 %rd<2>;\n.reg .b32 %r<2>;\n\
ld.param.u64 %rd1, [p];\nmov.b32 %r1, 1;\nst.global.u32 [%rd1], %r1;\nret;\n}\n";

#[test]
fn an_illegal_address_left_by_another_kernel_is_reported_by_the_next_call() {
    if std::env::var_os(STICKY_CHILD).is_some() {
        return sticky_child();
    }
    if gpu().is_none() {
        return;
    }
    // The context is lost for good after the fault: a child process takes it.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "an_illegal_address_left_by_another_kernel_is_reported_by_the_next_call",
            "--nocapture",
        ])
        .env(STICKY_CHILD, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the call after an illegal address hung (killed after 300 s)");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    say(&text);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("sticky case passed"), "{text}");
}

fn sticky_child() {
    let ctx = gpu().unwrap();
    let rt = Runtime::load(ctx.clone(), dir_of(None).unwrap()).unwrap();
    merges_correctly(&ctx, &rt);
    let stream = ctx.default_stream();
    let prepared = prepare(&stream);
    ctx.bind_to_thread().unwrap();
    let ptx = CString::new(FAULT_PTX).unwrap();
    // SAFETY: NUL-terminated PTX; the context is current.
    let module = unsafe { result::module::load_data(ptx.as_ptr() as *const c_void) }.unwrap();
    // SAFETY: the module holds `fault`.
    let f =
        unsafe { result::module::get_function(module, CString::new("fault").unwrap()) }.unwrap();
    let mut bad_address: u64 = 1 << 47;
    let mut params = [&mut bad_address as *mut u64 as *mut c_void];
    // SAFETY: one 8-byte parameter; the store faults, which is the point.
    unsafe { result::launch_kernel(f, (1, 1, 1), (1, 1, 1), 0, stream.cu_stream(), &mut params) }
        .unwrap();
    let fault = stream.synchronize().unwrap_err();
    println!("the fault: {fault:?}");
    // The next merge: an error naming the sticky error, at the launch or the next synchronize.
    let k = rt.kernel(KERNEL).unwrap();
    // SAFETY: buffers of this context, alive until the end of the function.
    let launched = unsafe { k.launch(&stream, &prepared.args) };
    println!("the merge after it: {launched:?}");
    let text = match launched {
        Err(e) => e.to_string(),
        Ok(()) => format!("{:?}", stream.synchronize().unwrap_err()),
    };
    assert!(text.contains("CUDA_ERROR_"), "{text}");
    if text.contains("CUDA_ERROR_ILLEGAL_ADDRESS") && text.contains(KERNEL) {
        assert!(text.contains("sticky"), "{text}");
    }
    let e = Runtime::load(ctx.clone(), dir_of(None).unwrap())
        .err()
        .expect("a load in a faulted context fails");
    println!("the load after it: {e}");
    assert!(e.to_string().contains("CUDA_ERROR_"), "{e}");
    println!("sticky case passed");
}

#[test]
fn fork_after_the_first_call_neither_hangs_the_child_nor_breaks_the_parent() {
    let Some(ctx) = gpu() else { return };
    let rt = Runtime::load(ctx.clone(), dir_of(None).unwrap()).unwrap();
    merges_correctly(&ctx, &rt);
    // Buffers and arguments made before the fork: the child only launches.
    let stream = ctx.default_stream();
    let prepared = prepare(&stream);
    let k: &Kernel = rt.kernel(KERNEL).unwrap();
    // SAFETY: fork in a test process; the child only launches and leaves through _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: the buffers are allocated in this (inherited) context's view; CUDA in a
        // forked child is expected to fail, and that is what is being checked.
        let code = match unsafe { k.launch(&stream, &prepared.args) } {
            Ok(()) => 0,
            Err(_) => 10,
        };
        // SAFETY: leave without running the parent's destructors or atexit handlers.
        unsafe { libc::_exit(code) };
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child, without blocking.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the forked child's call hung (killed after 120 s)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        libc::WIFEXITED(status),
        "the forked child crashed (status {status})"
    );
    say(&format!(
        "fork: the child's launch {}",
        if libc::WEXITSTATUS(status) == 0 {
            "went through"
        } else {
            "returned an error"
        }
    ));
    merges_correctly(&ctx, &rt);
}

#[test]
fn a_folder_built_only_for_sm_120_names_its_archs_and_the_device() {
    let Some(ctx) = gpu() else { return };
    let cc = ctx.compute_capability().unwrap();
    if cc.0 >= 12 {
        say("SKIPPED: the device runs sm_120 itself");
        return;
    }
    let good = dir_of(None).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let only = tmp.path().join("sm120");
    copy_folder(&good, &only);
    let path = only.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for k in m["kernels"].as_array_mut().unwrap() {
        k["archs"]
            .as_array_mut()
            .unwrap()
            .retain(|a| a["arch"] == "sm_120");
    }
    std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
    let e = Runtime::load(ctx.clone(), &only).err().expect("refused");
    say(&format!("sm_120 only: {e}"));
    let text = e.to_string();
    let dev = format!("sm_{}{}", cc.0, cc.1);
    assert!(
        text.contains("archs: sm_120") && text.contains(&dev),
        "{text}"
    );
}

#[test]
fn a_second_gpu_runs_its_own_runtime_and_refuses_the_first_ones_kernels() {
    if gpu().is_none() {
        return;
    }
    let Ok(n) = CudaContext::device_count() else {
        return;
    };
    if n < 2 {
        say("SKIPPED: one GPU; the second-GPU case needs two");
        return;
    }
    let (first, second) = (CudaContext::new(0).unwrap(), CudaContext::new(1).unwrap());
    let dir: PathBuf = dir_of(None).unwrap();
    let rt0 = Runtime::load(first.clone(), &dir).unwrap();
    let rt1 = Runtime::load(second.clone(), &dir).unwrap();
    merges_correctly(&second, &rt1);
    let k = rt0.kernel(KERNEL).unwrap();
    let e = run_case(
        k,
        LseBase::E,
        &second.default_stream(),
        16,
        8,
        None,
        true,
        5,
        None,
    )
    .unwrap_err();
    assert!(e.contains("another CUDA context"), "{e}");
}
