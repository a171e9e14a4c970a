//! Programmatic dependent launch on a GPU (compute capability 9.0 or newer; skips loudly
//! elsewhere). A producer writes every input of a merge (prefix and suffix rows and both lse in
//! one buffer) late, after letting a PDL-launched dependent start at once; the pdl merge launched
//! right behind it must still equal the float64 reference, launched programmatically and plainly.
//! A control launches the kernel built without pdl programmatically: it has no wait, so it must
//! read unfinished inputs (else this test could not tell). `pdl_pair_bench` (ignored: run with
//! --ignored) times producer -> merge pairs, eager and in a CUDA graph, with and without PDL.
//!
//! Environment: MLA_GEN_PDL_DIR (default .device/pdl): `gen/` generated from tests/gpu-pdl.toml and
//! `producer.sm_90.{cubin,ptx}` (bench/gpu/pdl.sh build); MLA_GEN_PDL_BENCH_JSON = where the
//! bench writes its numbers.
#![cfg(feature = "runtime")]

use std::ffi::{c_void, CString};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaSlice, CudaStream, DevicePtr};

use mla_gen::dtype::Dtype;
use mla_gen::reference::{self, Layout};
use mla_gen::runtime::{self, Checked, DeviceBuffer, Kernel, MergeArgs, Runtime};

fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// What the tests share: the stream, the pdl kernels and the producer.
struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    rt: Runtime,
    late_writer: sys::CUfunction,
    writer: sys::CUfunction,
    _producer: sys::CUmodule,
}

fn dir() -> PathBuf {
    std::env::var_os("MLA_GEN_PDL_DIR").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.device/pdl")),
        PathBuf::from,
    )
}

fn gpu() -> Option<Gpu> {
    if !runtime::driver_present() {
        say("SKIPPED PDL GPU test: no CUDA driver here; run bench/gpu/pdl.sh run on a GPU machine");
        return None;
    }
    let ctx = match CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => {
            say(&format!("SKIPPED PDL GPU test: no usable GPU ({e:?})"));
            return None;
        }
    };
    let cc = ctx.compute_capability().unwrap();
    if cc.0 < 9 {
        say(&format!(
            "SKIPPED PDL GPU test: compute capability {}.{} has no programmatic dependent launch",
            cc.0, cc.1
        ));
        return None;
    }
    let dir = dir();
    let rt = Runtime::load(ctx.clone(), dir.join("gen")).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (build it with bench/gpu/pdl.sh build)",
            dir.display()
        )
    });
    // The CUBIN on an sm_90 device, else the PTX (the driver compiles it).
    let (file, cubin) = if cc == (9, 0) {
        ("producer.sm_90.cubin", true)
    } else {
        ("producer.sm_90.ptx", false)
    };
    let mut image = std::fs::read(dir.join(file)).unwrap();
    if !cubin {
        image.push(0);
    }
    ctx.bind_to_thread().unwrap();
    // SAFETY: a complete image, alive for the call; the context is current.
    let module = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }.unwrap();
    let function = |name: &str| {
        // SAFETY: the module is loaded in the current context.
        unsafe { result::module::get_function(module, CString::new(name).unwrap()) }.unwrap()
    };
    Some(Gpu {
        stream: ctx.new_stream().unwrap(),
        late_writer: function("pdl_late_writer"),
        writer: function("pdl_writer"),
        _producer: module,
        ctx,
        rt,
    })
}

fn ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    s.device_ptr(stream).0
}

/// A producer launch: (dst, src, n_words, last) with `last` its delay or trigger flag; plain, so
/// it starts after the previous work on the stream ends. The late writer takes few blocks (about
/// one per SM), so that the merge's blocks find room beside it at once, as a small producer
/// leaves: the window in which a missing wait would read unfinished inputs is then wide open.
fn produce(g: &Gpu, f: sys::CUfunction, dst: u64, src: u64, n_words: usize, last: i64) {
    let mut values: [u64; 4] = [dst, src, n_words as u64, last as u64];
    let mut params: Vec<*mut c_void> = values
        .iter_mut()
        .map(|v| v as *mut u64 as *mut c_void)
        .collect();
    let most = if f == g.late_writer { 128 } else { 132 * 8 };
    let blocks = n_words.div_ceil(256).clamp(1, most) as u32;
    // SAFETY: the producer's four 8-byte parameters; dst and src hold n_words words.
    unsafe {
        result::launch_kernel(
            f,
            (blocks, 1, 1),
            (256, 1, 1),
            0,
            g.stream.cu_stream(),
            &mut params,
        )
    }
    .unwrap();
}

/// One merge problem: its inputs packed into one buffer of words (prefix rows, suffix rows,
/// prefix lse, suffix lse), as the producer writes them.
struct Case {
    t: usize,
    h: usize,
    d: usize,
    n: usize,
    head_major: bool,
}

impl Case {
    fn rows(&self) -> usize {
        self.t * self.h * self.d
    }
    /// Word offsets of the four inputs and the total: rows are bf16, two to a word.
    fn offsets(&self) -> [usize; 5] {
        let (r, l) = (self.rows() / 2, self.t * self.h);
        [0, r, 2 * r, 2 * r + l, 2 * r + 2 * l]
    }
    fn kernel<'a>(&self, g: &'a Gpu, pdl: bool) -> &'a Arc<Kernel> {
        let name = format!(
            "merge_attn_states_bf16_d{}_thr_lse{}{}",
            self.d,
            if self.head_major { "" } else { "_tm" },
            if pdl { "_pdl" } else { "" }
        );
        g.rt.kernel(&name)
            .unwrap_or_else(|| panic!("{name} is not in {}", dir().display()))
    }
    /// The inputs as words: random bf16 rows, lse in [-8, 8) with some +inf, -inf and NaN.
    fn source(&self, seed: u64) -> Vec<u32> {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        let o = self.offsets();
        let mut words = vec![0u32; o[4]];
        let bf = |v: f64| u32::from(mla_gen::half::bf16::from_f64(v).to_bits());
        for w in &mut words[..o[2]] {
            *w = bf(next() * 8.0 - 4.0) | (bf(next() * 8.0 - 4.0) << 16);
        }
        for (i, w) in words[o[2]..].iter_mut().enumerate() {
            let v = match i % 61 {
                7 => f32::INFINITY,
                19 => f32::NEG_INFINITY,
                43 => f32::NAN,
                _ => (next() * 16.0 - 8.0) as f32,
            };
            *w = v.to_bits();
        }
        words
    }
    fn args(&self, inputs: u64, output: u64, output_lse: u64) -> MergeArgs {
        let o = self.offsets();
        let at = |word: usize, len: usize, dtype| DeviceBuffer {
            ptr: inputs + 4 * word as u64,
            len,
            dtype,
        };
        let l = Layout::contiguous(self.h, self.d);
        MergeArgs {
            output: DeviceBuffer {
                ptr: output,
                len: self.rows(),
                dtype: Dtype::Bf16,
            },
            output_lse: Some(DeviceBuffer {
                ptr: output_lse,
                len: self.t * self.h,
                dtype: Dtype::F32,
            }),
            prefix: at(o[0], self.rows(), Dtype::Bf16),
            suffix: at(o[1], self.rows(), Dtype::Bf16),
            prefix_lse: at(o[2], self.t * self.h, Dtype::F32),
            suffix_lse: at(o[3], self.t * self.h, Dtype::F32),
            output_scale: None,
            output_scales: None,
            num_tokens: self.t,
            num_heads: self.h,
            output_layout: l,
            prefix_layout: l,
            suffix_layout: l,
            prefill_tokens_with_context: Some(self.n),
        }
    }
    /// Output elements and lse values that differ from the float64 reference of `src`.
    fn mismatches(&self, src: &[u32], out: &[u16], out_lse: &[f32]) -> usize {
        let o = self.offsets();
        let bf = |i: usize, base: usize| {
            let w = src[base + i / 2];
            f64::from(mla_gen::half::bf16::from_bits((w >> (16 * (i % 2))) as u16))
        };
        let mut bad = 0;
        for t in 0..self.t {
            for h in 0..self.h {
                let li = reference::lse_index(self.head_major, self.t, self.h, t, h);
                let (p, s) = (
                    f32::from_bits(src[o[2] + li]),
                    f32::from_bits(src[o[3] + li]),
                );
                let row = reference::merge_row(p, s, t < self.n);
                bad += usize::from(!reference::lse_matches(row.lse(), out_lse[li]));
                for d in 0..self.d {
                    let i = (t * self.h + h) * self.d + d;
                    let got = f64::from(mla_gen::half::bf16::from_bits(out[i]));
                    bad += usize::from(!reference::element_matches(
                        Dtype::Bf16,
                        &row,
                        bf(i, o[0]),
                        bf(i, o[1]),
                        got,
                    ));
                }
            }
        }
        bad
    }
}

/// How the merge is launched behind the late writer.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// The pdl kernel with programmatic stream serialization.
    Programmatic,
    /// The pdl kernel, plain cuLaunchKernel.
    Plain,
    /// The kernel without pdl (no wait), launched programmatically: must race.
    Control,
}

/// The function of kernel `k` from its own module, loaded anew: the control launches it
/// programmatically, past the runtime's refusal. Loaded before the producer is launched, so that
/// loading cannot wait for it.
fn own_function(k: &Kernel) -> (sys::CUmodule, sys::CUfunction) {
    let mut image = std::fs::read(dir().join("gen").join(&k.loaded_from)).unwrap();
    if !k.loaded_from.ends_with(".cubin") {
        image.push(0);
    }
    // SAFETY: a complete image; the context is current (bound by gpu()).
    let module = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }.unwrap();
    // SAFETY: the module is loaded in the current context.
    let f =
        unsafe { result::module::get_function(module, CString::new(k.name()).unwrap()) }.unwrap();
    (module, f)
}

/// `f` (a merge kernel) launched with programmatic stream serialization and `checked`'s values.
fn launch_ex_unchecked(g: &Gpu, f: sys::CUfunction, checked: &Checked) {
    let mut values: Vec<u64> = checked.values().to_vec();
    let mut params: Vec<*mut c_void> = values
        .iter_mut()
        .map(|v| v as *mut u64 as *mut c_void)
        .collect();
    let (block, shared) = (checked.block_threads, checked.shared_mem_bytes);
    // SAFETY: checked values in the kernel's order, alive for the call; the buffers live until
    // the caller synchronizes. The race is the point.
    unsafe {
        runtime::launch_programmatic(
            f,
            checked.grid.unwrap(),
            block,
            shared,
            g.stream.cu_stream(),
            &mut params,
        )
    }
    .unwrap();
}

/// Late writer (poisoned inputs written after `delay_ns`), then the merge; the mismatches.
fn run(g: &Gpu, case: &Case, mode: Mode, delay_ns: i64) -> usize {
    let s = &g.stream;
    let src_words = case.source(0x5eed ^ case.t as u64);
    let src = s.clone_htod(&src_words).unwrap();
    let inputs = s.alloc_zeros::<u32>(src_words.len()).unwrap();
    let out = s.alloc_zeros::<u16>(case.rows()).unwrap();
    let out_lse = s.alloc_zeros::<f32>(case.t * case.h).unwrap();
    let (pi, po, pl) = (ptr(&inputs, s), ptr(&out, s), ptr(&out_lse, s));
    s.synchronize().unwrap();
    // SAFETY: inside each allocation. NaN everywhere: an unfinished input shows in the output.
    unsafe {
        result::memset_d8_async(pi, 0xff, src_words.len() * 4, s.cu_stream()).unwrap();
        result::memset_d8_async(po, 0xff, case.rows() * 2, s.cu_stream()).unwrap();
        result::memset_d8_async(pl, 0xff, case.t * case.h * 4, s.cu_stream()).unwrap();
    }
    let k = case.kernel(g, mode != Mode::Control);
    let checked = k.check(&case.args(pi, po, pl).args()).unwrap();
    let control = (mode == Mode::Control).then(|| own_function(k));
    produce(
        g,
        g.late_writer,
        pi,
        ptr(&src, s),
        src_words.len(),
        delay_ns,
    );
    match (mode, control) {
        // SAFETY: this case's allocations, alive until the synchronize below.
        (Mode::Programmatic, _) => unsafe { k.launch_checked_as(s, &checked, true) }.unwrap(),
        // SAFETY: as above.
        (Mode::Plain, _) => unsafe { k.launch_checked_as(s, &checked, false) }.unwrap(),
        (_, control) => launch_ex_unchecked(g, control.unwrap().1, &checked),
    }
    s.synchronize().unwrap();
    if let Some((module, _)) = control {
        // SAFETY: its launch has finished; nothing else uses the module.
        unsafe { result::module::unload(module) }.unwrap();
    }
    let got: Vec<u16> = s.clone_dtoh(&out).unwrap();
    let got_lse: Vec<f32> = s.clone_dtoh(&out_lse).unwrap();
    case.mismatches(&src_words, &got, &got_lse)
}

const CASES: [(usize, usize, usize, usize, bool); 6] = [
    (1000, 16, 128, 700, true),
    (37, 3, 128, 37, false),
    (4096, 16, 128, 0, true),
    (4096, 16, 128, 4096, false),
    (513, 8, 512, 300, true),
    (2048, 16, 512, 2048, false),
];

#[test]
fn a_pdl_merge_never_reads_inputs_its_producer_writes_late() {
    let Some(g) = gpu() else { return };
    for (t, h, d, n, head_major) in CASES {
        let case = Case {
            t,
            h,
            d,
            n,
            head_major,
        };
        for mode in [Mode::Programmatic, Mode::Plain] {
            let bad = run(&g, &case, mode, 150_000);
            say(&format!(
                "T={t} H={h} D={d} n={n} head_major={head_major} {mode:?}: {bad} mismatches"
            ));
            assert_eq!(bad, 0, "T={t} H={h} D={d} n={n} {mode:?}");
        }
    }
}

#[test]
fn the_control_without_the_wait_reads_unfinished_inputs() {
    let Some(g) = gpu() else { return };
    let case = Case {
        t: 4096,
        h: 16,
        d: 128,
        n: 2048,
        head_major: true,
    };
    let bad = run(&g, &case, Mode::Control, 150_000);
    say(&format!(
        "control (no wait, programmatic launch): {bad} mismatches"
    ));
    assert!(
        bad > 0,
        "the merge without pdl saw finished inputs: this test cannot tell a missing wait"
    );
}

/// The median over `reps` of `f`'s stream time, in microseconds, divided by `per`.
fn timed(g: &Gpu, reps: usize, per: usize, mut f: impl FnMut()) -> f64 {
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut us: Vec<f64> = (0..reps)
        .map(|_| {
            let (a, b) = (
                g.ctx.new_event(flags).unwrap(),
                g.ctx.new_event(flags).unwrap(),
            );
            a.record(&g.stream).unwrap();
            f();
            b.record(&g.stream).unwrap();
            g.stream.synchronize().unwrap();
            f64::from(a.elapsed_ms(&b).unwrap()) * 1e3 / per as f64
        })
        .collect();
    us.sort_by(f64::total_cmp);
    us[us.len() / 2]
}

/// Producer -> merge pairs, eager (PAIRS back to back between two events) and replayed from a
/// CUDA graph of PAIRS pairs; µs per pair, median of REPS. The merge is the same pdl kernel
/// launched plainly or programmatically (and the kernel without pdl, plainly, to show the wait
/// costs nothing); the producer triggers its dependents first, or never (they then launch as it
/// ends). Inputs hot in L2, as after an attention kernel.
#[test]
#[ignore = "a benchmark: run with --ignored (bench/gpu/pdl.sh run)"]
fn pdl_pair_bench() {
    const PAIRS: usize = 200;
    const REPS: usize = 9;
    let Some(g) = gpu() else { return };
    let s = &g.stream;
    // (label, pdl kernel, programmatic launch, producer triggers)
    let modes = [
        ("no-pdl kernel", false, false, 0),
        ("pdl kernel, plain", true, false, 1),
        ("PDL, no trigger", true, true, 0),
        ("PDL, early trigger", true, true, 1),
    ];
    let mut json = Vec::new();
    say(&format!(
        "{:>4} {:>6} {:>3} | {:>9} | eager us/pair: {} | graph us/pair: same | saved eager, graph (plain - early trigger)",
        "D", "T", "H", "producer",
        modes.iter().map(|m| m.0).collect::<Vec<_>>().join(", ")
    ));
    for d in [128, 512] {
        for t in [256, 1024, 4096, 16384] {
            let case = Case {
                t,
                h: 16,
                d,
                n: t,
                head_major: true,
            };
            let words = case.source(7);
            let src = s.clone_htod(&words).unwrap();
            let inputs = s.alloc_zeros::<u32>(words.len()).unwrap();
            let out = s.alloc_zeros::<u16>(case.rows()).unwrap();
            let out_lse = s.alloc_zeros::<f32>(t * 16).unwrap();
            let (pi, psrc) = (ptr(&inputs, s), ptr(&src, s));
            let args = case.args(pi, ptr(&out, s), ptr(&out_lse, s));
            s.synchronize().unwrap();
            let producer_us = timed(&g, REPS, PAIRS, || {
                (0..PAIRS).for_each(|_| produce(&g, g.writer, pi, psrc, words.len(), 0))
            });
            let mut eager = Vec::new();
            let mut graph = Vec::new();
            for &(_, pdl, programmatic, trigger) in &modes {
                let k = case.kernel(&g, pdl);
                let checked = k.check(&args.args()).unwrap();
                let pairs = |n: usize| {
                    for _ in 0..n {
                        produce(&g, g.writer, pi, psrc, words.len(), trigger);
                        // SAFETY: this shape's allocations, alive until after the last synchronize.
                        unsafe { k.launch_checked_as(s, &checked, programmatic) }.unwrap();
                    }
                };
                pairs(20);
                eager.push(timed(&g, REPS, PAIRS, || pairs(PAIRS)));
                s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
                    .unwrap();
                pairs(PAIRS);
                let replay = s
                    .end_capture(sys::CUgraphInstantiate_flags(0))
                    .unwrap()
                    .unwrap();
                replay.upload().unwrap();
                replay.launch().unwrap();
                graph.push(timed(&g, REPS, PAIRS, || replay.launch().unwrap()));
            }
            let fmt = |v: &[f64]| {
                v.iter()
                    .map(|x| format!("{x:6.2}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            say(&format!(
                "{d:>4} {t:>6} {:>3} | {producer_us:9.2} | {} | {} | {:+.2}, {:+.2}",
                16,
                fmt(&eager),
                fmt(&graph),
                eager[1] - eager[3],
                graph[1] - graph[3]
            ));
            json.push(serde_json::json!({
                "head_size": d, "num_tokens": t, "num_heads": 16, "dtype": "bf16", "pairs": PAIRS,
                "producer_us": producer_us,
                "modes": modes.iter().map(|m| m.0).collect::<Vec<_>>(),
                "eager_us_per_pair": eager, "graph_us_per_pair": graph,
            }));
        }
    }
    if let Some(path) = std::env::var_os("MLA_GEN_PDL_BENCH_JSON") {
        std::fs::write(path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    }
}
