//! The decode session of c_session.h: a model loaded once, slots prefilled with prompt ids,
//! ids generated step by step. Runs on the CPU reference where there is no GPU.
use crate::{ffi, Error, Result};
use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::{self, NonNull};

/// Where the session runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// CUDA when built with it and a device is found, else the CPU.
    Auto,
    Cpu,
    Cuda,
}

/// How ids are picked from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    Greedy,
    /// Temperature, top-k (0: no limit) and top-p, with each slot's seed.
    Sample { temperature: f32, top_k: i32, top_p: f32 },
}

/// Options of [`Session::new`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SessionOptions {
    pub max_slots: i64,
    /// Positions per slot; 0: the model's, at most 4096.
    pub max_seq: i64,
    /// The built-in model's random weights (no model path).
    pub weight_seed: u64,
    pub backend: Backend,
    pub sampling: Sampling,
    /// CPU backend threads; 0: one per core.
    pub cpu_threads: i32,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            max_slots: 1,
            max_seq: 0,
            weight_seed: 0,
            backend: Backend::Auto,
            sampling: Sampling::Greedy,
            cpu_threads: 0,
        }
    }
}

/// What a session holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    pub vocab_size: i64,
    pub max_slots: i64,
    pub max_seq: i64,
    /// The backend that runs (Cpu or Cuda).
    pub backend: Backend,
}

/// A loaded model with its KV cache slots. Used by one thread at a time (it may move
/// between threads).
pub struct Session {
    raw: NonNull<ffi::stepgraph_session>,
    info: SessionInfo,
}

// The handle is used by one thread at a time (&mut self for every call that runs).
unsafe impl Send for Session {}

fn message(raw: *const ffi::stepgraph_session) -> String {
    // SAFETY: the library returns a NUL-terminated string, never NULL, valid until the next
    // call on the handle; it is copied at once.
    unsafe { CStr::from_ptr(ffi::stepgraph_session_error(raw)) }.to_string_lossy().into_owned()
}

impl Session {
    /// Loads a Hugging Face model folder, or the built-in tiny Llama with random weights
    /// when `model` is None.
    pub fn new(model: Option<&Path>, options: &SessionOptions) -> Result<Session> {
        let path = match model {
            None => None,
            Some(p) => Some(CString::new(p.to_string_lossy().into_owned()).map_err(|_| {
                Error::InvalidArgument(format!("model path {} holds a NUL byte", p.display()))
            })?),
        };
        let mut o = ffi::stepgraph_session_options::default();
        // SAFETY: a valid out pointer.
        unsafe { ffi::stepgraph_session_options_init(&mut o) };
        o.max_slots = options.max_slots;
        o.max_seq = options.max_seq;
        o.weight_seed = options.weight_seed;
        o.cpu_threads = options.cpu_threads;
        o.backend = match options.backend {
            Backend::Auto => ffi::STEPGRAPH_BACKEND_AUTO,
            Backend::Cpu => ffi::STEPGRAPH_BACKEND_CPU,
            Backend::Cuda => ffi::STEPGRAPH_BACKEND_CUDA,
        };
        if let Sampling::Sample { temperature, top_k, top_p } = options.sampling {
            o.sampling = ffi::STEPGRAPH_SAMPLING_SAMPLE;
            o.temperature = temperature;
            o.top_k = top_k;
            o.top_p = top_p;
        }
        let mut raw: *mut ffi::stepgraph_session = ptr::null_mut();
        // SAFETY: valid pointers; path lives through the call.
        let code = unsafe {
            ffi::stepgraph_session_create(path.as_ref().map_or(ptr::null(), |p| p.as_ptr()), &o,
                                          &mut raw)
        };
        if code != ffi::STEPGRAPH_OK {
            let text = if raw.is_null() { "out of memory".to_string() } else { message(raw) };
            // SAFETY: the handle of a failed create is destroyed once; NULL is ignored.
            unsafe { ffi::stepgraph_session_destroy(raw) };
            return Err(Error::from_code(code, text).expect("a failure code"));
        }
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::Unknown(code, "stepgraph_session_create gave no handle".to_string())
        })?;
        let mut session = Session {
            raw,
            info: SessionInfo { vocab_size: 0, max_slots: 0, max_seq: 0, backend: Backend::Cpu },
        };
        let mut info = ffi::stepgraph_session_info::default();
        // SAFETY: a live handle and a valid out pointer.
        let code = unsafe { ffi::stepgraph_session_get_info(session.raw.as_ptr(), &mut info) };
        session.check(code)?;
        session.info = SessionInfo {
            vocab_size: info.vocab_size,
            max_slots: info.max_slots,
            max_seq: info.max_seq,
            backend: if info.backend == ffi::STEPGRAPH_BACKEND_CUDA { Backend::Cuda } else { Backend::Cpu },
        };
        Ok(session)
    }

    pub fn info(&self) -> SessionInfo {
        self.info
    }

    fn check(&self, code: i32) -> Result<()> {
        match Error::from_code(code, String::new()) {
            None => Ok(()),
            Some(_) => Err(Error::from_code(code, message(self.raw.as_ptr())).unwrap()),
        }
    }

    /// Starts a sequence in `slot` with the prompt ids (ending the one it held).
    pub fn prefill(&mut self, slot: i64, ids: &[i32], seed: i32) -> Result<()> {
        // SAFETY: ids holds ids.len() values; the library reads no more.
        let code = unsafe {
            ffi::stepgraph_session_prefill(self.raw.as_ptr(), slot, ids.as_ptr(),
                                           ids.len() as i64, seed)
        };
        self.check(code)
    }

    /// ids.len() decode steps of every live slot; `slot`'s new ids into `ids`.
    pub fn generate_into(&mut self, slot: i64, ids: &mut [i32]) -> Result<()> {
        // SAFETY: ids has room for ids.len() values, the count passed.
        let code = unsafe {
            ffi::stepgraph_session_generate(self.raw.as_ptr(), slot, ids.len() as i64,
                                            ids.as_mut_ptr())
        };
        self.check(code)
    }

    /// n decode steps; `slot`'s n new ids.
    pub fn generate(&mut self, slot: i64, n: usize) -> Result<Vec<i32>> {
        let mut ids = vec![0i32; n];
        self.generate_into(slot, &mut ids)?;
        Ok(ids)
    }

    /// The f32 logits of `slot`'s row in the last step (vocab_size of them).
    pub fn logits(&mut self, slot: i64) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.info.vocab_size as usize];
        // SAFETY: out holds capacity floats.
        let code = unsafe {
            ffi::stepgraph_session_logits(self.raw.as_ptr(), slot, out.as_mut_ptr(),
                                          out.len() as i64)
        };
        self.check(code)?;
        Ok(out)
    }

    /// Ends `slot`'s sequence.
    pub fn release(&mut self, slot: i64) -> Result<()> {
        // SAFETY: a live handle.
        let code = unsafe { ffi::stepgraph_session_release(self.raw.as_ptr(), slot) };
        self.check(code)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: the handle is destroyed once, here.
        unsafe { ffi::stepgraph_session_destroy(self.raw.as_ptr()) };
    }
}
