//! stepgraph from Rust: the kernel library of include/stepgraph/c_api/c_api.h and the decode
//! sessions of c_session.h, over the C ABI. The raw declarations stay private (ffi.rs): what
//! is public is safe, takes slices and returns [`Result`]; the headers' constants are
//! [`consts`]. The libraries are found or built when the crate is built (build.rs) and opened
//! by path at run time, so a program depending on the crate runs without LD_LIBRARY_PATH.
//!
//! Kernels take device memory as [`DeviceSlice`] / [`DeviceSliceMut`]: a pointer and a length
//! that the caller vouches for once, unsafely, when making them. Every wrapper then checks
//! the slices' lengths against the shape it is given before calling, so a wrong size is an
//! [`Error::InvalidArgument`] rather than an out-of-bounds access. A library built without
//! CUDA, or a machine without a device, gives [`Error::NotAvailable`] for the device
//! functions once their arguments pass (the same checks run in both builds).
//!
//! [`Session`] runs the decode session: on the CPU reference when there is no GPU. With a
//! model that has a tokenizer it also turns text into ids and back ([`Session::encode`],
//! [`Session::decode`], [`Session::generate_text`]). [`SamplingOptions`] choose one call's
//! sampling, seed, penalties, min-p and logit bias ([`Session::prefill_with`],
//! [`Session::generate_text_with`]), and the text calls' stop strings
//! ([`SamplingOptions::stop`]: matched across token boundaries, left out of the text).

use std::ffi::{c_void, CStr};
use std::fmt;
use std::marker::PhantomData;
use std::ptr;

mod ffi;
pub use ffi::consts;

/// The folder the crate opens libstepgraph_c.so and libstepgraph_session_c.so from: the
/// STEPGRAPH_LIB_DIR the crate was built with, else the CMake build that build.rs ran.
pub const LIBRARY_DIR: &str = ffi::LIBRARY_DIR;

/// What a call refused or failed with (the C ABI's return codes), with a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// No device or driver, or a library built without CUDA (code -1): use a CPU path.
    NotAvailable(String),
    /// A bad size, shape, dtype, pointer or parameter (code -2).
    InvalidArgument(String),
    /// CUDA refused or failed the launch (code -3).
    LaunchFailed(String),
    /// Code -4.
    OutOfMemory(String),
    /// A text function on a model without a tokenizer (the built-in model; code -5 of
    /// c_session.h).
    NoTokenizer(String),
    /// The libraries could not be opened from [`LIBRARY_DIR`] (the loader's message).
    LibraryNotLoaded(String),
    /// A code this crate does not know.
    Unknown(i32, String),
}

impl Error {
    /// The error of a C return code, or None for STEPGRAPH_OK.
    pub fn from_code(code: i32, message: impl Into<String>) -> Option<Error> {
        let m = message.into();
        match code {
            ffi::STEPGRAPH_OK => None,
            ffi::STEPGRAPH_ERROR_NO_CUDA => Some(Error::NotAvailable(m)),
            ffi::STEPGRAPH_ERROR_INVALID_VALUE => Some(Error::InvalidArgument(m)),
            ffi::STEPGRAPH_ERROR_LAUNCH_FAILED => Some(Error::LaunchFailed(m)),
            ffi::STEPGRAPH_ERROR_OUT_OF_MEMORY => Some(Error::OutOfMemory(m)),
            ffi::STEPGRAPH_ERROR_NO_TOKENIZER => Some(Error::NoTokenizer(m)),
            ffi::LIBRARY_NOT_LOADED => {
                Some(Error::LibraryNotLoaded(ffi::load_error().unwrap_or(&m).to_string()))
            }
            c => Some(Error::Unknown(c, m)),
        }
    }

    /// The C return code.
    pub fn code(&self) -> i32 {
        match self {
            Error::NotAvailable(_) => ffi::STEPGRAPH_ERROR_NO_CUDA,
            Error::InvalidArgument(_) => ffi::STEPGRAPH_ERROR_INVALID_VALUE,
            Error::LaunchFailed(_) => ffi::STEPGRAPH_ERROR_LAUNCH_FAILED,
            Error::OutOfMemory(_) => ffi::STEPGRAPH_ERROR_OUT_OF_MEMORY,
            Error::NoTokenizer(_) => ffi::STEPGRAPH_ERROR_NO_TOKENIZER,
            Error::LibraryNotLoaded(_) => ffi::LIBRARY_NOT_LOADED,
            Error::Unknown(c, _) => *c,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Error::NotAvailable(m)
            | Error::InvalidArgument(m)
            | Error::LaunchFailed(m)
            | Error::OutOfMemory(m)
            | Error::NoTokenizer(m)
            | Error::LibraryNotLoaded(m)
            | Error::Unknown(_, m) => m,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", error_string(self.code()), self.code(), self.message())
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// The library's description of a return code.
pub fn error_string(code: i32) -> String {
    // The session library's own code, which the kernel library does not know.
    if code == ffi::STEPGRAPH_ERROR_NO_TOKENIZER {
        return "the model has no tokenizer".to_string();
    }
    if code == ffi::LIBRARY_NOT_LOADED {
        return "the stepgraph libraries could not be loaded".to_string();
    }
    // SAFETY: the library returns a static, never-NULL, NUL-terminated string.
    unsafe { CStr::from_ptr(ffi::stepgraph_error_string(code)) }.to_string_lossy().into_owned()
}

fn check(code: i32, function: &str) -> Result<()> {
    match Error::from_code(code, function) {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

fn invalid<T>(message: String) -> Result<T> {
    Err(Error::InvalidArgument(message))
}

/// The C ABI versions of the loaded libraries: (kernels, sessions).
pub fn abi_versions() -> (i32, i32) {
    // SAFETY: no arguments, no state.
    unsafe { (ffi::stepgraph_abi_version(), ffi::stepgraph_session_abi_version()) }
}

/// Opens the libraries now (the first call of any function does it too): Ok, or
/// [`Error::LibraryNotLoaded`] saying why they cannot be opened.
///
/// The raw C declarations are not part of the crate's API:
/// ```compile_fail
/// let _ = stepgraph::ffi::stepgraph_abi_version;
/// ```
pub fn load() -> Result<()> {
    match ffi::load_error() {
        None => Ok(()),
        Some(m) => Err(Error::LibraryNotLoaded(m.to_string())),
    }
}

/// Whether the kernel library can launch on a device here (built with CUDA, a device found).
pub fn device_available() -> bool {
    let mut bytes = 0i64;
    // SAFETY: a valid out pointer; the call only queries the device.
    unsafe { ffi::stepgraph_argmax_workspace_bytes(1, 64, &mut bytes) == ffi::STEPGRAPH_OK }
}

/// A CUDA stream (cudaStream_t) of the current device, or the default stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream(*mut c_void);

// A cudaStream_t may be used from any thread.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    /// The default (legacy NULL) stream.
    pub const DEFAULT: Stream = Stream(ptr::null_mut());

    /// # Safety
    /// `raw` is a cudaStream_t of the current device that outlives every call given it.
    pub unsafe fn from_raw(raw: *mut c_void) -> Stream {
        Stream(raw)
    }

    pub fn as_raw(self) -> *mut c_void {
        self.0
    }
}

impl Default for Stream {
    fn default() -> Self {
        Stream::DEFAULT
    }
}

/// bfloat16 bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bf16(pub u16);

/// IEEE half bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct F16(pub u16);

/// An element type of the C ABI and its `dtype` value.
pub trait Element: Copy + sealed::Sealed {
    const DTYPE: i32;
}
/// The float dtypes (math in f32).
pub trait Float: Element {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::Bf16 {}
    impl Sealed for super::F16 {}
    impl Sealed for i32 {}
}

impl Element for f32 {
    const DTYPE: i32 = ffi::STEPGRAPH_F32;
}
impl Element for Bf16 {
    const DTYPE: i32 = ffi::STEPGRAPH_BF16;
}
impl Element for F16 {
    const DTYPE: i32 = ffi::STEPGRAPH_F16;
}
impl Element for i32 {
    const DTYPE: i32 = ffi::STEPGRAPH_I32;
}
impl Float for f32 {}
impl Float for Bf16 {}
impl Float for F16 {}

/// `len` elements of device memory, read by the kernels.
#[derive(Clone, Copy, Debug)]
pub struct DeviceSlice<'a, T> {
    ptr: *const T,
    len: usize,
    _life: PhantomData<&'a T>,
}

/// `len` elements of device memory, written by the kernels.
#[derive(Debug)]
pub struct DeviceSliceMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _life: PhantomData<&'a mut T>,
}

impl<'a, T> DeviceSlice<'a, T> {
    /// # Safety
    /// `ptr` is device memory (cudaMalloc or managed) of at least `len` elements of T,
    /// aligned for T, valid and not written by others while 'a lasts and work enqueued
    /// with it runs.
    pub unsafe fn from_raw_parts(ptr: *const T, len: usize) -> Self {
        DeviceSlice { ptr, len, _life: PhantomData }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_ptr(&self) -> *const T {
        self.ptr
    }
    fn void(&self) -> *const c_void {
        self.ptr as *const c_void
    }
}

impl<'a, T> DeviceSliceMut<'a, T> {
    /// # Safety
    /// As for [`DeviceSlice::from_raw_parts`], and no other slice of this memory is used
    /// while 'a lasts.
    pub unsafe fn from_raw_parts(ptr: *mut T, len: usize) -> Self {
        DeviceSliceMut { ptr, len, _life: PhantomData }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.ptr
    }
    /// A read-only view for the length of this borrow.
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        DeviceSlice { ptr: self.ptr, len: self.len, _life: PhantomData }
    }
    fn void(&mut self) -> *mut c_void {
        self.ptr as *mut c_void
    }
}

/// The product of the dims as a length, or InvalidArgument when a dim is not positive or
/// the product overflows or passes STEPGRAPH_MAX_ELEMENTS.
fn elements(what: &str, dims: &[i64]) -> Result<usize> {
    let mut n: i64 = 1;
    for &d in dims {
        if d <= 0 {
            return invalid(format!("{what}: dimension {d} is not positive (dims {dims:?})"));
        }
        n = match n.checked_mul(d) {
            Some(v) if v <= ffi::STEPGRAPH_MAX_ELEMENTS => v,
            _ => return invalid(format!("{what}: dims {dims:?} hold too many elements")),
        };
    }
    Ok(n as usize)
}

fn expect_len(function: &str, what: &str, len: usize, want: usize) -> Result<()> {
    if len != want {
        return invalid(format!("{function}: {what} has {len} elements, the shape needs {want}"));
    }
    Ok(())
}

fn as_i64(what: &str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::InvalidArgument(format!("{what}: {v} is too large")))
}

/// The error word of the kernels that refuse out-of-range ids or positions: one device u32
/// (see STEPGRAPH_FLAG_*).
pub type ErrorFlags<'a> = DeviceSliceMut<'a, u32>;

fn flags_ptr(function: &str, flags: &mut ErrorFlags<'_>) -> Result<*mut u32> {
    expect_len(function, "error_flags", flags.len(), 1)?;
    Ok(flags.as_mut_ptr())
}

pub mod kernels;
mod session;
pub use session::{Backend, ChatMessage, EncodeOptions, Sampling, SamplingOptions, Session,
                  SessionInfo, SessionOptions};

/// Host only: the head_dim / 2 RoPE inverse frequencies into `inv_freq`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_max_position: i32 },
}

pub fn rope_inv_freq(head_dim: i32, theta: f32, scaling: RopeScaling, inv_freq: &mut [f32])
                     -> Result<()> {
    if head_dim < 2 || head_dim % 2 != 0 || inv_freq.len() != (head_dim / 2) as usize {
        return invalid(format!(
            "stepgraph_rope_inv_freq: head_dim {head_dim} must be even and >= 2, and inv_freq \
             hold head_dim / 2 values (it holds {})", inv_freq.len()));
    }
    let (s, f, lo, hi, omp) = match scaling {
        RopeScaling::None => (ffi::STEPGRAPH_ROPE_SCALING_NONE, 0.0, 0.0, 0.0, 0),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => (
            ffi::STEPGRAPH_ROPE_SCALING_LLAMA3, factor, low_freq_factor, high_freq_factor,
            original_max_position),
    };
    // SAFETY: inv_freq holds head_dim / 2 floats, checked above.
    check(unsafe { ffi::stepgraph_rope_inv_freq(head_dim, theta, s, f, lo, hi, omp,
                                                inv_freq.as_mut_ptr()) },
          "stepgraph_rope_inv_freq")
}
