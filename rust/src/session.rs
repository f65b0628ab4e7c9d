//! The decode session of c_session.h: a model loaded once, slots prefilled with prompt ids,
//! ids generated step by step, and text turned into ids and back with the model's
//! tokenizer. Runs on the CPU reference where there is no GPU.
use crate::{ffi, Error, Result};
use std::collections::HashSet;
use std::ffi::{c_char, CStr, CString};
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
    /// Temperature, top-k (0: no limit) and top-p, with each slot's seed. A temperature
    /// below [`crate::consts::STEPGRAPH_SESSION_MIN_TEMPERATURE`] decodes greedily.
    Sample { temperature: f32, top_k: i32, top_p: f32 },
}

/// One sequence's own way of choosing its ids, for [`Session::prefill_with`] and the
/// `*_with` generation calls. The default is the session's sampling with every control off;
/// the library checks every value and refuses a bad one naming it (InvalidArgument).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingOptions {
    /// None: the session's ([`SessionOptions::sampling`]). A sampling other than the
    /// session's is drawn on the host from each step's logits (its steps wait for the device).
    pub sampling: Option<Sampling>,
    /// The sequence's sampling seed.
    pub seed: i32,
    /// transformers' repetition penalty over the prompt's and the generated ids: a logit l
    /// becomes l / r where positive, l * r otherwise. > 0; 1: off.
    pub repetition_penalty: f32,
    /// OpenAI's presence and frequency penalties over the generated ids: l - (presence +
    /// frequency * times generated). In [-2, 2]; 0: off.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// Sampled ids have at least min_p times the top one's probability. In [0, 1]; 0: off.
    pub min_p: f32,
    /// (id, bias) added to the id's logit, OpenAI's logit_bias: at most
    /// [`crate::consts::STEPGRAPH_SAMPLING_MAX_LOGIT_BIAS`], each id once, biases in
    /// [-100, 100] (-100 bans an id, 100 all but forces it).
    pub logit_bias: Vec<(i32, f32)>,
    /// Stop strings of the text calls ([`Session::generate_text_with`],
    /// [`Session::generate_chat_with`]): the text ends before the first of them to appear,
    /// matched on the decoded text across token boundaries and left out of it (of two that
    /// complete at the same character, the longer). At most
    /// [`SamplingOptions::MAX_STOP_STRINGS`], each 1 to [`SamplingOptions::MAX_STOP_BYTES`]
    /// bytes; the id calls ([`Session::prefill_with`], [`Session::generate_until_with`])
    /// refuse them, as ids are not text.
    pub stop: Vec<String>,
}

impl SamplingOptions {
    /// The most stop strings a call takes (OpenAI's limit, as `stepgraph serve`'s).
    pub const MAX_STOP_STRINGS: usize = 4;
    /// The most bytes of one stop string.
    pub const MAX_STOP_BYTES: usize = 256;

    // InvalidArgument naming the stop string that is out of bounds, if one is.
    fn check_stop(&self) -> Result<()> {
        if self.stop.len() > Self::MAX_STOP_STRINGS {
            return Err(Error::InvalidArgument(format!(
                "sampling.stop: {} stop strings, at most {} are taken",
                self.stop.len(), Self::MAX_STOP_STRINGS)));
        }
        // A String is UTF-8 already: only the length can be wrong.
        for (i, s) in self.stop.iter().enumerate() {
            if s.is_empty() || s.len() > Self::MAX_STOP_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "sampling.stop[{i}]: each stop string must hold 1 to {} bytes, got {}",
                    Self::MAX_STOP_BYTES, s.len())));
            }
        }
        Ok(())
    }

    // The id calls' refusal of stop strings.
    fn refuse_stop(&self, call: &str) -> Result<()> {
        if self.stop.is_empty() {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "sampling.stop: stop strings are matched on text; {call} takes ids (give them to \
             generate_text_with or generate_chat_with)")))
    }
}

impl Default for SamplingOptions {
    fn default() -> Self {
        SamplingOptions {
            sampling: None,
            seed: 0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            min_p: 0.0,
            logit_bias: Vec::new(),
            stop: Vec::new(),
        }
    }
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

/// How [`Session::encode`] reads a text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    /// The text is one user turn of the model's chat template, with the assistant's turn
    /// opened after it (as `stepgraph run --chat`).
    pub chat: bool,
    /// bos / eos where the tokenizer's files ask for them (ignored with `chat`: the template
    /// writes its own).
    pub add_special: bool,
    /// Special tokens written in the text ("<|im_end|>") become their ids; false keeps them
    /// text. Must be true with `chat`.
    pub parse_special: bool,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions { chat: false, add_special: true, parse_special: true }
    }
}

impl EncodeOptions {
    /// One user turn of the chat template.
    pub fn chat() -> Self {
        EncodeOptions { chat: true, ..EncodeOptions::default() }
    }
}

// A first guess of a text call's buffer; a larger one is asked for when the library says
// so (the size-query convention of c_session.h), so a guess only saves a call.
const SPARE: usize = 64;
const BYTES_PER_ID: usize = 8;

/// One message of a conversation, for [`Session::encode_chat`] and
/// [`Session::generate_chat`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChatMessage<'a> {
    /// "system", "user", "assistant", or what the model's template knows.
    pub role: &'a str,
    pub content: &'a str,
}

// The messages as the JSON array stepgraph_session_encode_chat reads.
fn messages_json(messages: &[ChatMessage]) -> String {
    fn string(out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    let mut out = String::from("[");
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"role\":");
        string(&mut out, m.role);
        out.push_str(",\"content\":");
        string(&mut out, m.content);
        out.push('}');
    }
    out.push(']');
    out
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

/// A loaded model with its KV cache slots.
///
/// Threads: a `Session` is `Send` but not `Sync`, on purpose. The C handle may be used by
/// one thread at a time (it holds the session's buffers and its last error), so every call
/// that runs takes `&mut self`, and the compiler refuses to share a `&Session` between
/// threads. Move it to the thread that uses it, or put it in a `Mutex` to share it: the
/// lock is then the caller's choice, not a cost every single-threaded user pays.
///
/// ```
/// fn movable<T: Send>() {}
/// movable::<stepgraph::Session>();
/// ```
///
/// ```compile_fail
/// fn shareable<T: Sync>() {}
/// shareable::<stepgraph::Session>(); // a Session cannot be used from two threads at once
/// ```
pub struct Session {
    raw: NonNull<ffi::stepgraph_session>,
    info: SessionInfo,
    // The session's sampling, which SamplingOptions::sampling None stands for.
    sampling: Sampling,
}

// SAFETY: the handle has no tie to the thread that made it; it is used by one thread at a
// time, which &mut self on every call that runs guarantees (Session is not Sync).
unsafe impl Send for Session {}

fn message(raw: *const ffi::stepgraph_session) -> String {
    // SAFETY: the library returns a NUL-terminated string, never NULL, valid until the next
    // call on the handle; it is copied at once.
    unsafe { CStr::from_ptr(ffi::stepgraph_session_error(raw)) }.to_string_lossy().into_owned()
}

impl Session {
    /// Loads a Hugging Face model folder or a GGUF file, or the built-in tiny Llama with
    /// random weights (and no tokenizer) when `model` is None.
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
            sampling: options.sampling,
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

    /// Starts a sequence in `slot` with the prompt ids, choosing its ids as `options` says
    /// (whose stop strings it refuses: they belong to the text calls).
    pub fn prefill_with(&mut self, slot: i64, ids: &[i32], options: &SamplingOptions)
                        -> Result<()> {
        options.refuse_stop("prefill_with")?;
        self.prefill_sampled(slot, ids, options)
    }

    // prefill_with, whatever options.stop holds.
    fn prefill_sampled(&mut self, slot: i64, ids: &[i32], options: &SamplingOptions)
                       -> Result<()> {
        let count = i32::try_from(options.logit_bias.len())
            .ok()
            .filter(|&n| n <= ffi::STEPGRAPH_SAMPLING_MAX_LOGIT_BIAS)
            .ok_or_else(|| Error::InvalidArgument(format!(
                "sampling.logit_bias_count: {} logit biases, at most {} are taken",
                options.logit_bias.len(), ffi::STEPGRAPH_SAMPLING_MAX_LOGIT_BIAS)))?;
        let bias_ids: Vec<i32> = options.logit_bias.iter().map(|&(id, _)| id).collect();
        let bias_values: Vec<f32> = options.logit_bias.iter().map(|&(_, v)| v).collect();
        // Zeroed, then filled by the library (its defaults and struct_size).
        // SAFETY: a plain C struct, for which all zeroes (NULL pointers) is a valid value.
        let mut c: ffi::stepgraph_sampling = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out pointer.
        let code = unsafe { ffi::stepgraph_sampling_init(&mut c) };
        self.check(code)?;
        match options.sampling.unwrap_or(self.sampling) {
            Sampling::Greedy => c.mode = ffi::STEPGRAPH_SAMPLING_GREEDY,
            Sampling::Sample { temperature, top_k, top_p } => {
                c.mode = ffi::STEPGRAPH_SAMPLING_SAMPLE;
                c.temperature = temperature;
                c.top_k = top_k;
                c.top_p = top_p;
            }
        }
        c.repetition_penalty = options.repetition_penalty;
        c.presence_penalty = options.presence_penalty;
        c.frequency_penalty = options.frequency_penalty;
        c.min_p = options.min_p;
        c.logit_bias_count = count;
        if count > 0 {
            c.logit_bias_ids = bias_ids.as_ptr();
            c.logit_bias_values = bias_values.as_ptr();
        }
        // SAFETY: ids holds ids.len() values; c's arrays hold `count` values each and live
        // through the call, which keeps nothing of them.
        let code = unsafe {
            ffi::stepgraph_session_prefill_sampled(self.raw.as_ptr(), slot, ids.as_ptr(),
                                                   ids.len() as i64, options.seed, &c)
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

    // ---- text (the model's tokenizer) ----

    /// The token ids of `text`. [`Error::NoTokenizer`] for a model without a tokenizer (the
    /// built-in one).
    pub fn encode(&mut self, text: &str, options: &EncodeOptions) -> Result<Vec<i32>> {
        self.encode_bytes(text.as_bytes(), options)
    }

    /// As [`Session::encode`], for text given as bytes: bytes that are not UTF-8 are
    /// refused (InvalidArgument).
    pub fn encode_bytes(&mut self, text: &[u8], options: &EncodeOptions) -> Result<Vec<i32>> {
        let mut flags = 0;
        if options.chat {
            flags |= ffi::STEPGRAPH_TEXT_CHAT;
        }
        if !options.add_special {
            flags |= ffi::STEPGRAPH_TEXT_NO_ADD_SPECIAL;
        }
        if !options.parse_special {
            flags |= ffi::STEPGRAPH_TEXT_LITERAL_SPECIAL;
        }
        let bytes = i64::try_from(text.len())
            .map_err(|_| Error::InvalidArgument(format!("a text of {} bytes", text.len())))?;
        let raw = self.raw.as_ptr();
        self.sized_ids("stepgraph_session_encode", text.len(), |ids, capacity, count| {
            // SAFETY: text holds `bytes` bytes and ids `capacity` values, the sizes passed.
            unsafe {
                ffi::stepgraph_session_encode(raw, text.as_ptr() as *const c_char, bytes, flags,
                                              ids, capacity, count)
            }
        })
    }

    /// The token ids of a conversation through the model's chat template, followed by the
    /// prompt that opens the assistant's turn: what transformers'
    /// `apply_chat_template(messages, add_generation_prompt=True, tokenize=True)` gives. The
    /// template decides which roles and orders it takes (InvalidArgument says why not).
    pub fn encode_chat(&mut self, messages: &[ChatMessage]) -> Result<Vec<i32>> {
        let json = messages_json(messages);
        let bytes = i64::try_from(json.len())
            .map_err(|_| Error::InvalidArgument(format!("messages of {} bytes", json.len())))?;
        let raw = self.raw.as_ptr();
        self.sized_ids("stepgraph_session_encode_chat", json.len(), |ids, capacity, count| {
            // SAFETY: json holds `bytes` bytes and ids `capacity` values, the sizes passed.
            unsafe {
                ffi::stepgraph_session_encode_chat(raw, json.as_ptr() as *const c_char, bytes,
                                                   ids, capacity, count)
            }
        })
    }

    // The ids a text call writes: call(ids, capacity, count) with room for the guess and a
    // few more, then once more with the size the library asks for.
    fn sized_ids(&mut self, function: &str, guess: usize,
                 mut call: impl FnMut(*mut i32, i64, *mut i64) -> i32) -> Result<Vec<i32>> {
        let mut ids = vec![0i32; guess + SPARE];
        for _ in 0..2 {
            let mut count = 0i64;
            let code = call(ids.as_mut_ptr(), ids.len() as i64, &mut count);
            if code == ffi::STEPGRAPH_ERROR_INVALID_VALUE && count > ids.len() as i64 {
                ids.resize(count as usize, 0);
                continue;
            }
            self.check(code)?;
            ids.truncate(count as usize);
            return Ok(ids);
        }
        Err(Error::LaunchFailed(format!("{function}: the size it asked for did not suffice")))
    }

    /// The text of token ids; `skip_special` leaves control tokens (bos, eos, <|im_end|>, ...)
    /// out. Bytes that do not form UTF-8 become U+FFFD. An id outside the tokenizer's
    /// vocabulary is InvalidArgument.
    pub fn decode(&mut self, ids: &[i32], skip_special: bool) -> Result<String> {
        let flags = if skip_special { ffi::STEPGRAPH_TEXT_SKIP_SPECIAL } else { 0 };
        let mut text = vec![0u8; ids.len() * BYTES_PER_ID + SPARE];
        for _ in 0..2 {
            let mut length = 0i64;
            // SAFETY: ids holds ids.len() values and text text.len() bytes, the sizes passed.
            let code = unsafe {
                ffi::stepgraph_session_decode(self.raw.as_ptr(), ids.as_ptr(), ids.len() as i64,
                                              flags, text.as_mut_ptr() as *mut c_char,
                                              text.len() as i64, &mut length)
            };
            if code == ffi::STEPGRAPH_ERROR_INVALID_VALUE && length >= text.len() as i64 {
                text.resize(length as usize + 1, 0);
                continue;
            }
            self.check(code)?;
            text.truncate(length as usize);
            return String::from_utf8(text).map_err(|e| {
                Error::LaunchFailed(format!(
                    "stepgraph_session_decode gave text that is not UTF-8: {e}"))
            });
        }
        Err(Error::LaunchFailed("stepgraph_session_decode: the size it asked for did not suffice"
            .to_string()))
    }

    /// The ids that end a sequence, as the model's files state them; `chat` adds the chat
    /// template's end-of-turn id (which needs the tokenizer).
    pub fn stop_ids(&mut self, chat: bool) -> Result<Vec<i32>> {
        let flags = if chat { ffi::STEPGRAPH_TEXT_CHAT } else { 0 };
        let mut count = 0i64;
        // SAFETY: a size query: NULL with capacity 0.
        let code = unsafe {
            ffi::stepgraph_session_stop_ids(self.raw.as_ptr(), flags, ptr::null_mut(), 0,
                                            &mut count)
        };
        self.check(code)?;
        let mut ids = vec![0i32; count as usize];
        // SAFETY: ids holds ids.len() values, the capacity passed.
        let code = unsafe {
            ffi::stepgraph_session_stop_ids(self.raw.as_ptr(), flags, ids.as_mut_ptr(),
                                            ids.len() as i64, &mut count)
        };
        self.check(code)?;
        ids.truncate(count as usize);
        Ok(ids)
    }

    /// Starts `slot` with `prompt` (as [`Session::encode`] reads it) and returns the text
    /// of at most `max_new_tokens` new ids, stopping before the first stop id (of
    /// [`Session::stop_ids`]) unless `stop` is false; special tokens are left out of it.
    pub fn generate_text(&mut self, slot: i64, prompt: &str, options: &EncodeOptions,
                         max_new_tokens: usize, stop: bool) -> Result<String> {
        self.generate_text_with(slot, prompt, options, max_new_tokens, stop,
                                &SamplingOptions::default())
    }

    /// [`Session::generate_text`] choosing the ids as `sampling` says, and ending the text
    /// before the first of `sampling.stop` (see [`SamplingOptions::stop`]).
    pub fn generate_text_with(&mut self, slot: i64, prompt: &str, options: &EncodeOptions,
                              max_new_tokens: usize, stop: bool, sampling: &SamplingOptions)
                              -> Result<String> {
        sampling.check_stop()?;
        let ids = self.encode(prompt, options)?;
        let stops: HashSet<i32> =
            if stop { self.stop_ids(options.chat)?.into_iter().collect() } else { HashSet::new() };
        self.generate_text_of(slot, &ids, max_new_tokens, &stops, sampling)
    }

    /// Starts `slot` with the conversation (rendered as [`Session::encode_chat`] renders it)
    /// and returns the text of the assistant's reply: at most `max_new_tokens` new ids,
    /// ending before the chat's first stop id unless `stop` is false, special tokens left
    /// out.
    pub fn generate_chat(&mut self, slot: i64, messages: &[ChatMessage], max_new_tokens: usize,
                         stop: bool) -> Result<String> {
        self.generate_chat_with(slot, messages, max_new_tokens, stop, &SamplingOptions::default())
    }

    /// [`Session::generate_chat`] choosing the ids as `sampling` says, and ending the text
    /// before the first of `sampling.stop` (see [`SamplingOptions::stop`]).
    pub fn generate_chat_with(&mut self, slot: i64, messages: &[ChatMessage],
                              max_new_tokens: usize, stop: bool, sampling: &SamplingOptions)
                              -> Result<String> {
        sampling.check_stop()?;
        let ids = self.encode_chat(messages)?;
        let stops: HashSet<i32> =
            if stop { self.stop_ids(true)?.into_iter().collect() } else { HashSet::new() };
        self.generate_text_of(slot, &ids, max_new_tokens, &stops, sampling)
    }

    // The text calls from the prompt's ids: the new ids' text, special tokens left out,
    // ending before the first of sampling.stop (checked by the caller).
    fn generate_text_of(&mut self, slot: i64, prompt: &[i32], max_new_tokens: usize,
                        stops: &HashSet<i32>, sampling: &SamplingOptions) -> Result<String> {
        if sampling.stop.is_empty() {
            let new = self.ids_until(slot, prompt, max_new_tokens, stops, sampling)?;
            return self.decode(&new, true);
        }
        // Stop strings are found in the text as it comes, so the ids are decoded as they
        // come: a window of a few ids at a time (the C ABI decodes whole id sequences only).
        let mut text = TextPieces::default();
        let mut matcher = StopMatcher::new(&sampling.stop);
        let mut out = String::new();
        self.steps(slot, prompt, max_new_tokens, stops, sampling, true, |s, id| {
            if let Some(piece) = text.push(s, id, false)? {
                out.push_str(&matcher.push(&piece));
            }
            Ok(!matcher.stopped)
        })?;
        if !matcher.stopped {
            if let Some(piece) = text.push(self, -1, true)? {
                out.push_str(&matcher.push(&piece));
            }
            out.push_str(&matcher.finish());
        }
        Ok(out)
    }

    /// Starts `slot` with the prompt ids and returns at most `max_new_tokens` new ids,
    /// ending before the first id in `stops`.
    pub fn generate_until(&mut self, slot: i64, prompt: &[i32], max_new_tokens: usize,
                          stops: &HashSet<i32>) -> Result<Vec<i32>> {
        self.generate_until_with(slot, prompt, max_new_tokens, stops, &SamplingOptions::default())
    }

    /// [`Session::generate_until`] choosing the ids as `sampling` says (whose stop strings
    /// it refuses: ids are not text).
    pub fn generate_until_with(&mut self, slot: i64, prompt: &[i32], max_new_tokens: usize,
                               stops: &HashSet<i32>, sampling: &SamplingOptions)
                               -> Result<Vec<i32>> {
        sampling.refuse_stop("generate_until_with")?;
        self.ids_until(slot, prompt, max_new_tokens, stops, sampling)
    }

    // generate_until_with, whatever sampling.stop holds.
    fn ids_until(&mut self, slot: i64, prompt: &[i32], max_new_tokens: usize,
                 stops: &HashSet<i32>, sampling: &SamplingOptions) -> Result<Vec<i32>> {
        let mut out = Vec::new();
        self.steps(slot, prompt, max_new_tokens, stops, sampling, false, |_, id| {
            out.push(id);
            Ok(true)
        })?;
        Ok(out)
    }

    // Prefills `slot` with the prompt and hands each new id to `take` until it returns
    // false, an id of `stops` comes (not handed on) or max_new_tokens ids were made.
    // `watched`: take may end the generation whatever `stops` holds.
    fn steps(&mut self, slot: i64, prompt: &[i32], max_new_tokens: usize, stops: &HashSet<i32>,
             sampling: &SamplingOptions, watched: bool,
             mut take: impl FnMut(&mut Session, i32) -> Result<bool>) -> Result<()> {
        if max_new_tokens == 0 {
            return Err(Error::InvalidArgument("max_new_tokens must be >= 1".to_string()));
        }
        // The stop strings are this binding's, not the library's.
        let unsampled = SamplingOptions { stop: Vec::new(), ..sampling.clone() };
        if unsampled == SamplingOptions::default() {
            self.prefill(slot, prompt, 0)?;
        } else {
            self.prefill_sampled(slot, prompt, sampling)?;
        }
        // Steps in chunks so that a stop ends the work early; the CPU steps one at a time
        // (a step there costs far more than a call).
        let chunk = if stops.is_empty() && !watched {
            max_new_tokens
        } else if self.info.backend == Backend::Cpu {
            1
        } else {
            8
        };
        let mut done = 0;
        while done < max_new_tokens {
            let k = chunk.min(max_new_tokens - done);
            let got = self.generate(slot, k)?;
            done += k;
            for id in got {
                if stops.contains(&id) || !take(self, id)? {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

// A stream may hold back text that ends in U+FFFD while a character's bytes may still be
// arriving: a UTF-8 character spans at most 4 bytes, so more ids than this behind it make
// it a real one.
const HELD_IDS: usize = 8;

// The text of ids given one at a time, piece by piece, as Python's stream makes it: each
// piece is the text the newest ids add to that of the ids of the piece before (so that a
// tokenizer's word starts come out as in decoding the whole), and costs a decode of a few
// ids, not of everything so far: the text of n ids costs O(n) however it is cut.
#[derive(Default)]
struct TextPieces {
    ids: Vec<i32>,
    // ids[start..done] is context already given; ids[done..] is not.
    start: usize,
    done: usize,
}

impl TextPieces {
    // Adds `id` (none when `last`) and returns the next piece, or None while the text ends
    // in a character whose bytes may still be arriving. `last`: the ids have ended.
    fn push(&mut self, s: &mut Session, id: i32, last: bool) -> Result<Option<String>> {
        if !last {
            self.ids.push(id);
        }
        let before = s.decode(&self.ids[self.start..self.done], true)?;
        let after = s.decode(&self.ids[self.start..], true)?;
        if !last && after.ends_with('\u{FFFD}') && self.ids.len() - self.done < HELD_IDS {
            return Ok(None);
        }
        // The new text is what follows `before` in `after`: all of it does, unless a
        // character that `before` ended in U+FFFD was completed (then from the first
        // character that differs).
        let mut same = before.bytes().zip(after.bytes()).take_while(|(a, b)| a == b).count();
        while !after.is_char_boundary(same) {
            same -= 1;
        }
        self.start = self.done;
        self.done = self.ids.len();
        // The window's ids are now context: drop those before it, so memory stays bounded.
        if self.start > HELD_IDS * 4 {
            self.ids.drain(..self.start);
            self.done -= self.start;
            self.start = 0;
        }
        Ok(Some(after[same..].to_string()))
    }
}

// Stop strings found in text given piece by piece, as tools/stop_matcher.h finds them: the
// first to complete ends the text where it begins (of two completing at the same byte, the
// longer), and the longest end of the text that could still begin one is held back. Each
// stop string runs a Knuth-Morris-Pratt automaton over the bytes, so the cost is linear in
// the text (plus the stop strings' lengths, once).
struct StopMatcher<'a> {
    stops: Vec<KmpStop<'a>>,
    held: String,
    stopped: bool,
}

struct KmpStop<'a> {
    text: &'a [u8],
    // fail[i]: the length of the longest proper prefix of text[..=i] that is also its end.
    fail: Vec<usize>,
    // The length of the longest end of the text so far that begins this stop string.
    state: usize,
}

impl<'a> StopMatcher<'a> {
    fn new(stops: &'a [String]) -> StopMatcher<'a> {
        let stops = stops.iter().map(|s| {
            let t = s.as_bytes();
            let mut fail = vec![0; t.len()];
            let mut k = 0;
            for i in 1..t.len() {
                while k > 0 && t[i] != t[k] {
                    k = fail[k - 1];
                }
                if t[i] == t[k] {
                    k += 1;
                }
                fail[i] = k;
            }
            KmpStop { text: t, fail, state: 0 }
        }).collect();
        StopMatcher { stops, held: String::new(), stopped: false }
    }

    // The text that follows `piece` safely; sets `stopped` when a stop string completed.
    fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        for (i, &b) in piece.as_bytes().iter().enumerate() {
            let mut longest = 0;
            for s in &mut self.stops {
                while s.state > 0 && s.text[s.state] != b {
                    s.state = s.fail[s.state - 1];
                }
                if s.text[s.state] == b {
                    s.state += 1;
                }
                if s.state == s.text.len() {
                    longest = longest.max(s.state);
                }
            }
            if longest > 0 {
                // A stop string ends at a character's end and begins at a character's
                // start (it is UTF-8), so both cuts fall between characters.
                self.stopped = true;
                self.held.push_str(&piece[..=i]);
                self.held.truncate(self.held.len() - longest);
                return std::mem::take(&mut self.held);
            }
        }
        self.held.push_str(piece);
        // Each state is at most the held text's length (it grows by one a byte, from at most
        // what was held), and the held end begins a stop string, so a character's start.
        let hold = self.stops.iter().map(|s| s.state).max().unwrap_or(0);
        let rest = self.held.split_off(self.held.len() - hold);
        std::mem::replace(&mut self.held, rest)
    }

    // The held text, once the text has ended (no stop string can complete any more).
    fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: the handle is destroyed once, here.
        unsafe { ffi::stepgraph_session_destroy(self.raw.as_ptr()) };
    }
}
