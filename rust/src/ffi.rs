//! The raw declarations of include/stepgraph/c_api/c_api.h and c_session.h, argument by argument
//! (names and types). tests/c_api/check_signatures.py compares this file with the headers,
//! so a changed or swapped argument fails CI instead of corrupting memory at run time.
//! Everything here is `unsafe` to call and private to the crate: the safe layer is lib.rs,
//! kernels.rs and session.rs.
//!
//! The two libraries are opened at run time (dlopen) from the folder build.rs found or built,
//! whose path is compiled into the crate. Why not link them: the loader would then need their
//! folder in the final program's rpath, and a crate cannot give its dependents' programs an
//! rpath (cargo:rustc-link-arg reaches only this crate's own targets), so a program that
//! depends on this crate would not start without LD_LIBRARY_PATH. Linking the C ABI
//! statically instead would mean repeating CMake's link line (every room's archive, Abseil's
//! shared libraries, CUDA's) in build.rs. Opened by path, the libraries are found by any
//! program built with the crate, wherever it runs from, as long as the folder stays.
//!
//! Each function below is a wrapper of the same name and signature that calls the library's
//! symbol. When the libraries cannot be opened, the wrappers return LIBRARY_NOT_LOADED (a
//! code the C ABI never returns; lib.rs makes it [`crate::Error::LibraryNotLoaded`] with the
//! loader's message) instead of calling anything.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// The headers' constants, public as `stepgraph::consts`.
pub mod consts {
    pub const STEPGRAPH_C_API_VERSION: i32 = 2;
    pub const STEPGRAPH_SESSION_API_VERSION: i32 = 3;

    pub const STEPGRAPH_OK: i32 = 0;
    pub const STEPGRAPH_ERROR_NO_CUDA: i32 = -1;
    pub const STEPGRAPH_ERROR_INVALID_VALUE: i32 = -2;
    pub const STEPGRAPH_ERROR_LAUNCH_FAILED: i32 = -3;
    pub const STEPGRAPH_ERROR_OUT_OF_MEMORY: i32 = -4;

    pub const STEPGRAPH_F32: i32 = 0;
    pub const STEPGRAPH_BF16: i32 = 1;
    pub const STEPGRAPH_F16: i32 = 2;
    pub const STEPGRAPH_I32: i32 = 3;

    pub const STEPGRAPH_FLAG_TOKEN_OUT_OF_RANGE: u32 = 1;
    pub const STEPGRAPH_FLAG_POSITION_OUT_OF_RANGE: u32 = 2;

    pub const STEPGRAPH_MAX_ELEMENTS: i64 = 1 << 36;
    pub const STEPGRAPH_MATMUL_MAX_ROWS: i64 = 8;
    pub const STEPGRAPH_ATTENTION_MAX_HEAD_DIM: i64 = 256;
    pub const STEPGRAPH_MOE_MAX_EXPERTS: i64 = 4096;
    pub const STEPGRAPH_TOPK_MAX_K: i64 = 1024;
    pub const STEPGRAPH_FLASH_MAX_HEAD_DIM: i64 = 256;
    pub const STEPGRAPH_CLIP_MAX_BUFFERS: i64 = 65536;

    pub const STEPGRAPH_ROPE_SCALING_NONE: i32 = 0;
    pub const STEPGRAPH_ROPE_SCALING_LLAMA3: i32 = 1;

    pub const STEPGRAPH_BACKEND_AUTO: i32 = 0;
    pub const STEPGRAPH_BACKEND_CPU: i32 = 1;
    pub const STEPGRAPH_BACKEND_CUDA: i32 = 2;
    pub const STEPGRAPH_SAMPLING_GREEDY: i32 = 0;
    pub const STEPGRAPH_SAMPLING_SAMPLE: i32 = 1;
    /// Sampling below this temperature is greedy decoding.
    pub const STEPGRAPH_SESSION_MIN_TEMPERATURE: f32 = 1e-5;
    pub const STEPGRAPH_ERROR_NO_TOKENIZER: i32 = -5;
    pub const STEPGRAPH_TEXT_CHAT: u32 = 1;
    pub const STEPGRAPH_TEXT_NO_ADD_SPECIAL: u32 = 2;
    pub const STEPGRAPH_TEXT_LITERAL_SPECIAL: u32 = 4;
    pub const STEPGRAPH_TEXT_SKIP_SPECIAL: u32 = 8;
    pub const STEPGRAPH_SESSION_MAX_TEXT_BYTES: i64 = 1 << 30;
    pub const STEPGRAPH_SESSION_MAX_CHAT_MESSAGES: i64 = 1 << 16;
    pub const STEPGRAPH_SESSION_MAX_DECODE_IDS: i64 = 1 << 28;
    pub const STEPGRAPH_SAMPLING_MAX_LOGIT_BIAS: i32 = 64;
    pub const STEPGRAPH_SAMPLING_MAX_PENALTY: f32 = 2.0;
    pub const STEPGRAPH_SAMPLING_MAX_BIAS: f32 = 100.0;
}
pub use consts::*;

/// What a wrapper returns when the libraries could not be opened: outside every C ABI code.
pub const LIBRARY_NOT_LOADED: i32 = -1000;

/// The folder build.rs found the libraries in, or built them in.
pub const LIBRARY_DIR: &str = env!("STEPGRAPH_RUST_LIB_DIR");
const KERNEL_LIBRARY: &str = "libstepgraph_c.so";
const SESSION_LIBRARY: &str = "libstepgraph_session_c.so";

extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *mut c_char;
}
const RTLD_NOW: c_int = 2;

fn loader_message() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string, copied at once.
    let e = unsafe { dlerror() };
    if e.is_null() {
        "no message from the loader".to_string()
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

fn open(name: &str) -> Result<*mut c_void, String> {
    let path = format!("{LIBRARY_DIR}/{name}");
    let c = CString::new(path.clone()).map_err(|_| format!("{path} holds a NUL byte"))?;
    // SAFETY: a NUL-terminated path; the handle is kept for the life of the process.
    let handle = unsafe { dlopen(c.as_ptr(), RTLD_NOW) };
    if handle.is_null() {
        return Err(format!("cannot open {path}: {} (rebuild the crate, or set \
                            STEPGRAPH_LIB_DIR when building it)", loader_message()));
    }
    Ok(handle)
}

fn symbol(libraries: &[*mut c_void], name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).expect("a function name");
    for &l in libraries {
        // SAFETY: a handle of dlopen and a NUL-terminated name.
        let f = unsafe { dlsym(l, c.as_ptr()) };
        if !f.is_null() {
            return Ok(f);
        }
    }
    Err(format!("{name} is missing from the libraries in {LIBRARY_DIR}"))
}

/// The value a wrapper returns without calling, when the libraries are not loaded.
trait NotLoaded {
    fn not_loaded() -> Self;
}
impl NotLoaded for i32 {
    fn not_loaded() -> i32 {
        LIBRARY_NOT_LOADED
    }
}
impl NotLoaded for *const c_char {
    fn not_loaded() -> *const c_char {
        b"the stepgraph libraries could not be loaded\0".as_ptr().cast()
    }
}
impl NotLoaded for () {
    fn not_loaded() {}
}

/// Why the libraries could not be loaded, or None once they are.
pub fn load_error() -> Option<&'static str> {
    functions().err()
}

/// Declares the C functions: a table of pointers resolved once, and a wrapper per function.
macro_rules! c_functions {
    ($(pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        struct Functions {
            $($name: unsafe extern "C" fn($($ty),*) $(-> $ret)?,)*
        }

        fn resolve() -> Result<Functions, String> {
            let libraries = [open(KERNEL_LIBRARY)?, open(SESSION_LIBRARY)?];
            // SAFETY: each symbol is the function declared with this signature (the
            // signature check holds the declarations to the headers).
            Ok(Functions {
                $($name: unsafe { std::mem::transmute(symbol(&libraries, stringify!($name))?) },)*
            })
        }

        $(pub unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
            match functions() {
                Ok(f) => unsafe { (f.$name)($($arg),*) },
                Err(_) => NotLoaded::not_loaded(),
            }
        })*
    };
}

fn functions() -> Result<&'static Functions, &'static str> {
    static FUNCTIONS: OnceLock<Result<Functions, String>> = OnceLock::new();
    FUNCTIONS.get_or_init(resolve).as_ref().map_err(|e| e.as_str())
}

/// The opaque session of c_session.h.
#[repr(C)]
pub struct stepgraph_session {
    _opaque: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct stepgraph_session_options {
    pub struct_size: i64,
    pub max_slots: i64,
    pub max_seq: i64,
    pub weight_seed: u64,
    pub backend: i32,
    pub sampling: i32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub cpu_threads: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct stepgraph_sampling {
    pub struct_size: i64,
    pub mode: i32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub min_p: f32,
    pub logit_bias_count: i32,
    pub logit_bias_ids: *const i32,
    pub logit_bias_values: *const f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct stepgraph_session_info {
    pub vocab_size: i64,
    pub max_slots: i64,
    pub max_seq: i64,
    pub backend: i32,
}

c_functions! {
    // ---- c_api.h
    pub fn stepgraph_abi_version() -> i32;
    pub fn stepgraph_error_string(code: i32) -> *const c_char;
    pub fn stepgraph_embedding(table: *const c_void, ids: *const i32, out: *mut c_void, rows: i64,
                               vocab: i64, hidden: i64, dtype: i32, error_flags: *mut u32,
                               stream: *mut c_void) -> i32;
    pub fn stepgraph_matmul(x: *const c_void, w: *const c_void, bias: *const c_void,
                            y: *mut c_void, m: i64, n: i64, k: i64, dtype: i32,
                            stream: *mut c_void) -> i32;
    pub fn stepgraph_rmsnorm(x: *const c_void, weight: *const c_void, y: *mut c_void, rows: i64,
                             hidden: i64, eps: f32, dtype: i32, stream: *mut c_void) -> i32;
    pub fn stepgraph_add(a: *const c_void, b: *const c_void, y: *mut c_void, n: i64, dtype: i32,
                         stream: *mut c_void) -> i32;
    pub fn stepgraph_mul(a: *const c_void, b: *const c_void, y: *mut c_void, n: i64, dtype: i32,
                         stream: *mut c_void) -> i32;
    pub fn stepgraph_silu(x: *const c_void, y: *mut c_void, n: i64, dtype: i32,
                          stream: *mut c_void) -> i32;
    pub fn stepgraph_silu_mul(gate: *const c_void, up: *const c_void, y: *mut c_void, n: i64,
                              dtype: i32, stream: *mut c_void) -> i32;
    pub fn stepgraph_scale(x: *const c_void, y: *mut c_void, n: i64, alpha: f32, dtype: i32,
                           stream: *mut c_void) -> i32;
    pub fn stepgraph_rope_inv_freq(head_dim: i32, theta: f32, scaling: i32, factor: f32,
                                   low_freq_factor: f32, high_freq_factor: f32,
                                   original_max_position: i32, inv_freq: *mut f32) -> i32;
    pub fn stepgraph_rope(x: *const c_void, pos: *const i32, inv_freq: *const f32, y: *mut c_void,
                          rows: i64, cols: i64, head_dim: i64, interleaved: i32, dtype: i32,
                          stream: *mut c_void) -> i32;
    pub fn stepgraph_kv_write(kv: *const c_void, pos: *const i32, cache: *mut c_void, rows: i64,
                              slots: i64, kv_heads: i64, seq_len: i64, head_dim: i64, dtype: i32,
                              error_flags: *mut u32, stream: *mut c_void) -> i32;
    pub fn stepgraph_attention_workspace_bytes(rows: i64, heads: i64, kv_heads: i64,
                                               seq_len: i64, head_dim: i64,
                                               bytes: *mut i64) -> i32;
    pub fn stepgraph_attention(q: *const c_void, k_cache: *const c_void, v_cache: *const c_void,
                               pos: *const i32, out: *mut c_void, rows: i64, heads: i64,
                               kv_heads: i64, slots: i64, seq_len: i64, head_dim: i64,
                               scale: f32, dtype: i32, workspace: *mut c_void,
                               workspace_bytes: i64, error_flags: *mut u32,
                               stream: *mut c_void) -> i32;
    pub fn stepgraph_softmax(x: *const c_void, y: *mut c_void, rows: i64, n: i64, dtype: i32,
                             stream: *mut c_void) -> i32;
    pub fn stepgraph_argmax_workspace_bytes(rows: i64, vocab: i64, bytes: *mut i64) -> i32;
    pub fn stepgraph_argmax(logits: *const c_void, ids: *mut i32, rows: i64, vocab: i64,
                            dtype: i32, workspace: *mut c_void, workspace_bytes: i64,
                            stream: *mut c_void) -> i32;
    pub fn stepgraph_sample(logits: *const c_void, seeds: *const i32, pos: *const i32,
                            ids: *mut i32, rows: i64, vocab: i64, temperature: f32, top_k: i32,
                            top_p: f32, dtype: i32, stream: *mut c_void) -> i32;
    pub fn stepgraph_copy(src: *const c_void, dst: *mut c_void, n: i64, dtype: i32,
                          stream: *mut c_void) -> i32;
    pub fn stepgraph_advance(pos: *mut i32, n: i64, stream: *mut c_void) -> i32;

    // ---- c_api.h: top-k and attention over sequences
    pub fn stepgraph_topk(x: *const c_void, values: *mut c_void, indices: *mut i32, rows: i64,
                          n: i64, k: i64, dtype: i32, stream: *mut c_void) -> i32;
    pub fn stepgraph_flash_attention(q: *const c_void, k: *const c_void, v: *const c_void,
                                     out: *mut c_void, batch: i64, seq: i64, heads: i64,
                                     kv_heads: i64, head_dim: i64, scale: f32, causal: i32,
                                     dtype: i32, stream: *mut c_void) -> i32;

    // ---- c_api.h: general matrix products
    pub fn stepgraph_gemm(a: *const c_void, b: *const c_void, c: *mut c_void, m: i64, n: i64,
                          k: i64, trans_a: i32, trans_b: i32, alpha: f32, beta: f32, dtype: i32,
                          workspace: *mut c_void, workspace_bytes: i64,
                          stream: *mut c_void) -> i32;
    pub fn stepgraph_gemm_batched(a: *const c_void, b: *const c_void, c: *mut c_void, batch: i64,
                                  m: i64, n: i64, k: i64, stride_a: i64, stride_b: i64,
                                  stride_c: i64, trans_a: i32, trans_b: i32, alpha: f32,
                                  beta: f32, dtype: i32, workspace: *mut c_void,
                                  workspace_bytes: i64, stream: *mut c_void) -> i32;

    // ---- c_api.h: training
    pub fn stepgraph_cross_entropy(logits: *const c_void, targets: *const i32, loss: *mut f32,
                                   log_probs: *mut c_void, rows: i64, vocab: i64,
                                   ignore_index: i32, dtype: i32, error_flags: *mut u32,
                                   stream: *mut c_void) -> i32;
    pub fn stepgraph_cross_entropy_backward(logits: *const c_void, targets: *const i32,
                                            dloss: *const f32, dlogits: *mut c_void, rows: i64,
                                            vocab: i64, ignore_index: i32, dtype: i32,
                                            error_flags: *mut u32, stream: *mut c_void) -> i32;
    pub fn stepgraph_moe_aux_loss(router_probs: *const c_void, expert_ids: *const i32,
                                  loss: *mut f32, tokens: i64, experts: i64, top_k: i64,
                                  dtype: i32, error_flags: *mut u32, stream: *mut c_void) -> i32;
    pub fn stepgraph_adamw_step(param: *mut f32, grad: *const c_void, exp_avg: *mut f32,
                                exp_avg_sq: *mut f32, n: i64, lr: f32, beta1: f32, beta2: f32,
                                eps: f32, weight_decay: f32, step: i64, grad_dtype: i32,
                                stream: *mut c_void) -> i32;
    pub fn stepgraph_clip_grad_norm(grads: *const *mut c_void, sizes: *const i64, count: i64,
                                    max_norm: f32, dtype: i32, total_norm: *mut f32,
                                    stream: *mut c_void) -> i32;

    // ---- c_session.h
    pub fn stepgraph_session_abi_version() -> i32;
    pub fn stepgraph_session_options_init(options: *mut stepgraph_session_options) -> i32;
    pub fn stepgraph_sampling_init(sampling: *mut stepgraph_sampling) -> i32;
    pub fn stepgraph_session_create(model_path: *const c_char,
                                    options: *const stepgraph_session_options,
                                    session: *mut *mut stepgraph_session) -> i32;
    pub fn stepgraph_session_destroy(session: *mut stepgraph_session);
    pub fn stepgraph_session_error(session: *const stepgraph_session) -> *const c_char;
    pub fn stepgraph_session_get_info(session: *mut stepgraph_session,
                                      info: *mut stepgraph_session_info) -> i32;
    pub fn stepgraph_session_prefill(session: *mut stepgraph_session, slot: i64, ids: *const i32,
                                     n: i64, seed: i32) -> i32;
    pub fn stepgraph_session_prefill_sampled(session: *mut stepgraph_session, slot: i64,
                                             ids: *const i32, n: i64, seed: i32,
                                             sampling: *const stepgraph_sampling) -> i32;
    pub fn stepgraph_session_generate(session: *mut stepgraph_session, slot: i64, n: i64,
                                      ids: *mut i32) -> i32;
    pub fn stepgraph_session_logits(session: *mut stepgraph_session, slot: i64,
                                    logits: *mut f32, capacity: i64) -> i32;
    pub fn stepgraph_session_release(session: *mut stepgraph_session, slot: i64) -> i32;
    pub fn stepgraph_session_encode(session: *mut stepgraph_session, text: *const c_char,
                                    text_bytes: i64, flags: u32, ids: *mut i32, capacity: i64,
                                    count: *mut i64) -> i32;
    pub fn stepgraph_session_encode_chat(session: *mut stepgraph_session,
                                         messages_json: *const c_char, json_bytes: i64,
                                         ids: *mut i32, capacity: i64, count: *mut i64) -> i32;
    pub fn stepgraph_session_decode(session: *mut stepgraph_session, ids: *const i32, n: i64,
                                    flags: u32, text: *mut c_char, capacity: i64,
                                    length: *mut i64) -> i32;
    pub fn stepgraph_session_stop_ids(session: *mut stepgraph_session, flags: u32,
                                      ids: *mut i32, capacity: i64, count: *mut i64) -> i32;
}
