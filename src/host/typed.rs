//! The safe launch API over cudarc slices and views: a [`Launch`] takes each buffer as
//! `&impl DevicePtr<T>` (read) or `&mut impl DevicePtrMut<T>` (written), so `CudaSlice`,
//! `CudaView` and `CudaViewMut` at any offset all work; the address comes from the view, the
//! length from `DeviceSlice::len`, the element type from `T`. The kernel's check
//! ([`crate::host::check`]) runs on them before the launch, and every view's `SyncOnDrop` guard
//! lives until the launch is enqueued, so cudarc orders other streams' work around it.
//!
//! The Builder's generated module (`mla_gen_kernels.rs`) calls this with one method per kernel,
//! its element types fixed at compile time; [`crate::host::load::Runtime::select`] picks a kernel at
//! run time. The integers travel as [`Shape`]s (`args.rs`).

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

use crate::error::RuntimeError;
use crate::host::args::{NamedArgs, Shape, MAX_ARGS};
use crate::host::check::{Arg, MAX_PARAMS};
use crate::host::kernel::Kernel;

mod sealed {
    pub trait Sealed {}
}

/// Element types a kernel's buffers hold, with their manifest names. Sealed: the check
/// measures a buffer in elements of the manifest's type, so `T` must have its size.
pub trait Element: cudarc::driver::DeviceRepr + sealed::Sealed {
    const ELEM: &'static str;
}

macro_rules! element {
    ($($t:ty => $name:literal),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const ELEM: &'static str = $name;
        }
    )*};
}
element!(f32 => "f32", half::f16 => "f16", half::bf16 => "bf16", i32 => "i32",
         u8 => "u8");

/// One launch being assembled from views; [`Launch::run`] checks and launches it.
///
/// ```ignore
/// let mut l = Launch::new(&kernel, &stream);
/// l.output("output", &mut out).input("prefix_output", &prefix) /* ... */;
/// l.shape(&MergeShape::contiguous(t, h, d));
/// l.run()?;
/// ```
pub struct Launch<'a> {
    kernel: &'a Kernel,
    stream: &'a CudaStream,
    args: NamedArgs<'a>,
    guards: [Option<SyncOnDrop<'a>>; MAX_PARAMS],
    kept: usize,
    error: Option<RuntimeError>,
}

impl<'a> Launch<'a> {
    pub fn new(kernel: &'a Kernel, stream: &'a CudaStream) -> Launch<'a> {
        Launch {
            kernel,
            stream,
            args: NamedArgs::new(),
            guards: std::array::from_fn(|_| None),
            kept: 0,
            error: None,
        }
    }

    /// A buffer the kernel reads.
    pub fn input<T: Element, V: DevicePtr<T> + ?Sized>(
        &mut self,
        name: &'a str,
        view: &'a V,
    ) -> &mut Self {
        self.same_context(name, view.stream());
        // A shared borrow of a buffer the kernel writes would let other streams read it unordered
        // (cudarc records a read) and let another `&` holder see it change.
        if self.kernel.plan().writes(name) == Some(true) {
            self.fail(refusal(
                self.kernel,
                format!("the kernel writes {name}: pass it with Launch::output (a &mut view), not Launch::input"),
            ));
        }
        let len = view.len();
        let (ptr, guard) = view.device_ptr(self.stream);
        self.buffer(name, ptr, len, T::ELEM, guard)
    }

    /// A buffer the kernel writes (or reads and writes).
    pub fn output<T: Element, V: DevicePtrMut<T> + ?Sized>(
        &mut self,
        name: &'a str,
        view: &'a mut V,
    ) -> &mut Self {
        self.same_context(name, view.stream());
        let len = view.len();
        let (ptr, guard) = view.device_ptr_mut(self.stream);
        self.buffer(name, ptr, len, T::ELEM, guard)
    }

    /// [`Launch::input`]; `None` leaves the name out (null for a nullable parameter).
    pub fn input_opt<T: Element, V: DevicePtr<T> + ?Sized>(
        &mut self,
        name: &'a str,
        view: Option<&'a V>,
    ) -> &mut Self {
        match view {
            Some(v) => self.input(name, v),
            None => self,
        }
    }

    /// [`Launch::output`]; `None` leaves the name out (null for a nullable parameter).
    pub fn output_opt<T: Element, V: DevicePtrMut<T> + ?Sized>(
        &mut self,
        name: &'a str,
        view: Option<&'a mut V>,
    ) -> &mut Self {
        match view {
            Some(v) => self.output(name, v),
            None => self,
        }
    }

    /// No buffer for `name` (allowed where the kernel's parameter is nullable).
    pub fn null(&mut self, name: &'a str) -> &mut Self {
        self.args.push(name, Arg::Null);
        self
    }

    /// An integer argument (a count, stride or threshold).
    pub fn int(&mut self, name: &'a str, value: usize) -> &mut Self {
        self.args.int(name, value);
        self
    }

    /// The integers of a shape (counts and strides under their parameter names).
    pub fn shape(&mut self, shape: &impl Shape) -> &mut Self {
        shape.push_to(&mut self.args);
        self
    }

    /// Check every argument against the kernel's contract, then launch on the stream.
    pub fn run(self) -> Result<(), RuntimeError> {
        let Launch {
            kernel,
            stream,
            args,
            guards,
            error,
            ..
        } = self;
        if let Some(e) = error {
            return Err(e);
        }
        if args.overflowed() {
            return Err(refusal(kernel, format!("more than {} arguments", MAX_ARGS)));
        }
        let checked = kernel.check(&args)?;
        // SAFETY: every buffer argument is a cudarc view of this kernel's context (checked
        // when it was added; a `Shape` pushes integers only, and is sealed to this crate's):
        // its address and length (in elements of `T`, whose size is the manifest element's:
        // `Element` is sealed) describe live device memory, borrowed until the launch is
        // enqueued; the guards then record this launch's use, so cudarc orders later use and
        // the free of that memory after the kernel (as its own launches do).
        let launched = unsafe { kernel.launch_checked(stream, &checked) };
        drop(guards); // records this launch's use of each buffer, after it is enqueued
        launched
    }

    fn buffer(
        &mut self,
        name: &'a str,
        ptr: u64,
        len: usize,
        elem: &'static str,
        guard: SyncOnDrop<'a>,
    ) -> &mut Self {
        match self.guards.get_mut(self.kept) {
            Some(slot) => {
                *slot = Some(guard);
                self.kept += 1;
            }
            None => self.fail(refusal(
                self.kernel,
                format!("more than {MAX_PARAMS} buffers"),
            )),
        }
        self.args.push(
            name,
            Arg::Buffer {
                ptr,
                len: len as u64,
                elem: Some(elem),
            },
        );
        self
    }

    fn same_context(&mut self, name: &str, stream: &CudaStream) {
        if stream.context().cu_ctx() != self.kernel.context().cu_ctx() {
            self.fail(RuntimeError::WrongContext {
                kernel: self.kernel.name().to_string(),
                what: name.to_string(),
            });
        }
    }

    fn fail(&mut self, e: RuntimeError) {
        self.error.get_or_insert(e);
    }
}

fn refusal(kernel: &Kernel, problem: String) -> RuntimeError {
    RuntimeError::refused(kernel.name(), problem)
}
