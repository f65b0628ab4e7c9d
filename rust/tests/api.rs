// The Rust crate over the C ABI: codes, length checks before calls, the library's own
// argument checks, the host RoPE table, and sessions of the built-in model on the CPU.
use stepgraph::kernels::{self, CacheShape};
use stepgraph::*;
use std::collections::HashSet;

// Slices over host memory, for calls that must be refused before anything is launched, or
// in a build or on a machine where nothing can be launched.
fn slice<T>(v: &[T]) -> DeviceSlice<'_, T> {
    unsafe { DeviceSlice::from_raw_parts(v.as_ptr(), v.len()) }
}
fn slice_mut<T>(v: &mut [T]) -> DeviceSliceMut<'_, T> {
    unsafe { DeviceSliceMut::from_raw_parts(v.as_mut_ptr(), v.len()) }
}

fn is_invalid<T: std::fmt::Debug>(r: Result<T>) -> bool {
    matches!(r, Err(Error::InvalidArgument(_)))
}

#[test]
fn versions_match_the_headers() {
    let want = (consts::STEPGRAPH_C_API_VERSION, consts::STEPGRAPH_SESSION_API_VERSION);
    assert_eq!(abi_versions(), want);
}

#[test]
fn the_libraries_come_from_the_folder_build_rs_chose() {
    // STEPGRAPH_LIB_DIR when the crate was built with it (tools/test.sh), else its own
    // CMake build; opened by path, so this binary needs no LD_LIBRARY_PATH.
    assert_eq!(load(), Ok(()));
    let dir = std::path::Path::new(LIBRARY_DIR);
    for l in ["libstepgraph_c.so", "libstepgraph_session_c.so"] {
        assert!(dir.join(l).is_file(), "{l} is not in {LIBRARY_DIR}");
    }
    if let Some(d) = option_env!("STEPGRAPH_LIB_DIR") {
        assert_eq!(dir, std::path::Path::new(d).canonicalize().unwrap());
    }
    let e = Error::from_code(-1000, "");
    assert_eq!(e.map(|e| e.code()), Some(-1000));
}

#[test]
fn codes_round_trip() {
    for code in [-1, -2, -3, -4, -5, -77] {
        let e = Error::from_code(code, "m").unwrap();
        assert_eq!(e.code(), code);
        assert_eq!(e.message(), "m");
    }
    assert!(Error::from_code(0, "").is_none());
    assert!(matches!(Error::from_code(-1, ""), Some(Error::NotAvailable(_))));
    assert!(matches!(Error::from_code(-4, ""), Some(Error::OutOfMemory(_))));
    assert!(matches!(Error::from_code(-5, ""), Some(Error::NoTokenizer(_))));
    assert!(matches!(Error::from_code(5, ""), Some(Error::Unknown(5, _))));
    assert_ne!(error_string(-2), error_string(-3));
}

#[test]
fn lengths_are_checked_before_the_call() {
    let a = [1.5f32, -2.0, 3.25];
    let b = [0.5f32, 4.0];
    let mut y = [f32::NAN; 3];
    assert!(is_invalid(kernels::add(slice(&a), slice(&b), slice_mut(&mut y), Stream::DEFAULT)));
    assert!(is_invalid(kernels::silu(slice(&a), slice_mut(&mut y[..2]), Stream::DEFAULT)));
    let x = [0.25f32; 6];
    let w = [0.5f32; 3];
    let mut out = [0f32; 6];
    // rows 2 × hidden 3 with a weight of 3 passes the lengths; hidden 2 does not.
    assert!(is_invalid(kernels::rmsnorm(slice(&x), slice(&w), slice_mut(&mut out), 3, 2, 1e-5,
                                        Stream::DEFAULT)));
    assert!(is_invalid(kernels::rmsnorm(slice(&x), slice(&w), slice_mut(&mut out), 0, 3, 1e-5,
                                        Stream::DEFAULT)));
    let ids = [3i32, 1];
    let table = [0.1f32; 8];
    let mut emb = [0f32; 4];
    let mut flags = [0u32; 2];  // the error word is one u32
    assert!(is_invalid(kernels::embedding(slice(&table), slice(&ids), slice_mut(&mut emb), 4, 2,
                                          slice_mut(&mut flags), Stream::DEFAULT)));
    let mut flag = [0u32; 1];
    let mut emb_short = [0f32; 3];
    assert!(is_invalid(kernels::embedding(slice(&table), slice(&ids), slice_mut(&mut emb_short),
                                          4, 2, slice_mut(&mut flag), Stream::DEFAULT)));
    let q = [0f32; 8];
    let cache = [0f32; 2 * 2 * 4 * 2];
    let pos = [0i32; 2];
    let mut att = [0f32; 8];
    let shape = CacheShape { slots: 2, kv_heads: 2, seq_len: 4, head_dim: 2 };
    // q needs rows 2 × heads 4 × head_dim 2 = 16 elements.
    assert!(is_invalid(kernels::attention(slice(&q), slice(&cache), slice(&cache), slice(&pos),
                                          slice_mut(&mut att), 4, shape, 0.5, None,
                                          slice_mut(&mut flag), Stream::DEFAULT)));
    let huge = i64::MAX / 2;
    assert!(is_invalid(kernels::softmax(slice(&a), slice_mut(&mut y), huge, 4, Stream::DEFAULT)));
}

// Lengths that agree leave the library's checks: a bad parameter is refused by the library
// in both builds, with or without a device.
#[test]
fn the_library_checks_the_rest_in_every_build() {
    let x = [0.25f32, 1.0, -0.5, 2.0];
    let w = [1.0f32, 0.5];
    let mut y = [f32::NAN; 4];
    assert!(is_invalid(kernels::rmsnorm(slice(&x), slice(&w), slice_mut(&mut y), 2, 2, f32::NAN,
                                        Stream::DEFAULT)));
    let mut out = [0f32; 2 * 9];
    let wide = [0.5f32; 9 * 2];
    let xs = [1.0f32; 9 * 2];
    // m = 9 > STEPGRAPH_MATMUL_MAX_ROWS.
    assert!(is_invalid(kernels::matmul(slice(&xs), slice(&wide), None, slice_mut(&mut out), 9, 2,
                                       2, Stream::DEFAULT)));
    let logits = [0.5f32; 8];
    let seeds = [1i32, 2];
    let pos = [0i32, 0];
    let mut ids = [0i32; 2];
    let bad = kernels::SampleParams { temperature: 0.0, top_k: 0, top_p: 1.0 };
    assert!(is_invalid(kernels::sample(slice(&logits), slice(&seeds), slice(&pos),
                                       slice_mut(&mut ids), 4, bad, Stream::DEFAULT)));
}

#[test]
fn without_a_device_valid_calls_are_not_available() {
    if device_available() {
        return;  // host memory must not reach a kernel; the GPU tests cover this machine
    }
    let a = [1.5f32, -2.0, 3.25];
    let b = [0.5f32, 4.0, -1.0];
    let mut y = [f32::NAN; 3];
    let r = kernels::add(slice(&a), slice(&b), slice_mut(&mut y), Stream::DEFAULT);
    assert!(matches!(r, Err(Error::NotAvailable(_))), "{r:?}");
    assert!(y.iter().all(|v| v.is_nan()), "nothing may be written");
    assert!(matches!(kernels::argmax_workspace_bytes(2, 100), Err(Error::NotAvailable(_))));
}

#[test]
fn rope_inv_freq_is_theta_to_the_minus_two_i_over_d() {
    let mut f = vec![f32::NAN; 16];
    rope_inv_freq(32, 10000.0, RopeScaling::None, &mut f).unwrap();
    for (i, v) in f.iter().enumerate() {
        let want = 1.0 / 10000f64.powf(2.0 * i as f64 / 32.0);
        assert!(((*v as f64) - want).abs() <= 1e-6 * want, "{i}: {v} vs {want}");
    }
    let mut short = vec![0f32; 15];
    assert!(is_invalid(rope_inv_freq(32, 10000.0, RopeScaling::None, &mut short)));
    assert!(is_invalid(rope_inv_freq(32, 1e-45, RopeScaling::None, &mut f)));
    let bad = RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 4.0, high_freq_factor: 1.0,
                                    original_max_position: 8192 };
    assert!(is_invalid(rope_inv_freq(32, 500000.0, bad, &mut f)));
}

fn cpu(seed: u64) -> SessionOptions {
    SessionOptions { max_slots: 2, max_seq: 32, weight_seed: seed, backend: Backend::Cpu,
                     ..Default::default() }
}

#[test]
fn session_greedy_ids_are_the_argmax_of_the_logits() {
    let mut s = Session::new(None, &cpu(42)).unwrap();
    let info = s.info();
    assert_eq!(info.backend, Backend::Cpu);
    assert_eq!((info.max_slots, info.max_seq), (2, 32));
    s.prefill(0, &[5, 17, 300, 2], 0).unwrap();
    let mut last = 0;
    for _ in 0..4 {
        let id = s.generate(0, 1).unwrap()[0];
        let logits = s.logits(0).unwrap();
        assert_eq!(logits.len() as i64, info.vocab_size);
        let best = logits.iter().enumerate()
            .fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0;
        assert_eq!(id as usize, best);
        last = id;
    }
    // Another session with the same weights says the same; another seed, other logits.
    let mut t = Session::new(None, &cpu(42)).unwrap();
    t.prefill(1, &[5, 17, 300, 2], 0).unwrap();
    assert_eq!(*t.generate(1, 4).unwrap().last().unwrap(), last);
    let mut u = Session::new(None, &cpu(43)).unwrap();
    u.prefill(0, &[5, 17, 300, 2], 0).unwrap();
    u.generate(0, 1).unwrap();
    let mut v = Session::new(None, &cpu(42)).unwrap();
    v.prefill(0, &[5, 17, 300, 2], 0).unwrap();
    v.generate(0, 1).unwrap();
    assert_ne!(u.logits(0).unwrap(), v.logits(0).unwrap());
}

#[test]
fn session_errors_carry_the_librarys_message() {
    let mut s = Session::new(None, &cpu(1)).unwrap();
    match s.prefill(2, &[1, 2], 0) {
        Err(Error::InvalidArgument(m)) => assert!(!m.is_empty()),
        r => panic!("{r:?}"),
    }
    assert!(is_invalid(s.prefill(0, &[], 0)));
    assert!(is_invalid(s.prefill(0, &[s.info().vocab_size as i32], 0)));
    assert!(is_invalid(s.generate(0, 1)));  // nothing live
    s.prefill(0, &[1, 2], 0).unwrap();
    assert!(is_invalid(s.generate(0, 0)));
    assert!(is_invalid(s.generate(0, 100)));  // past max_seq
    s.release(0).unwrap();
    let missing = std::path::Path::new("/nonexistent/stepgraph-model");
    match Session::new(Some(missing), &cpu(1)) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("/nonexistent/stepgraph-model"), "{m}"),
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("a missing folder loaded"),
    }
    if !device_available() {
        let o = SessionOptions { backend: Backend::Cuda, ..cpu(1) };
        assert!(matches!(Session::new(None, &o), Err(Error::NotAvailable(_))));
    }
}

#[test]
fn training_lengths_and_parameters_are_checked() {
    let logits = [0.5f32; 12];
    let targets = [1i32, 2, 3];
    let mut loss = [0f32; 3];
    let mut flag = [0u32; 1];
    // 3 rows × vocab 5 = 15 logits, not 12.
    assert!(is_invalid(kernels::cross_entropy(slice(&logits), slice(&targets), slice_mut(&mut loss),
                                              None, 5, -100, slice_mut(&mut flag), Stream::DEFAULT)));
    let mut param = [1f32; 4];
    let grad = [0.5f32; 4];
    let mut m = [0f32; 4];
    let mut v = [0f32; 3];
    assert!(is_invalid(kernels::adamw_step(slice_mut(&mut param), slice(&grad), slice_mut(&mut m),
                                           slice_mut(&mut v), kernels::AdamW::default(), 1,
                                           Stream::DEFAULT)));
    let mut v4 = [0f32; 4];
    // step 0 is refused by the library, in every build.
    assert!(is_invalid(kernels::adamw_step(slice_mut(&mut param), slice(&grad), slice_mut(&mut m),
                                           slice_mut(&mut v4), kernels::AdamW::default(), 0,
                                           Stream::DEFAULT)));
    let mut norm = [0f32; 1];
    let mut none: Vec<DeviceSliceMut<f32>> = Vec::new();
    assert!(is_invalid(kernels::clip_grad_norm(&mut none, 1.0, slice_mut(&mut norm),
                                               Stream::DEFAULT)));
    let mut g1 = [1f32; 3];
    let mut bufs = vec![slice_mut(&mut g1)];
    assert!(is_invalid(kernels::clip_grad_norm(&mut bufs, f32::NAN, slice_mut(&mut norm),
                                               Stream::DEFAULT)));
    let probs = [0.25f32; 8];
    let ids = [0i32, 1, 2, 3];
    let mut l = [0f32; 1];
    // top_k 3 needs 6 ids for 2 tokens.
    assert!(is_invalid(kernels::moe_aux_loss(slice(&probs), slice(&ids), slice_mut(&mut l), 2, 4, 3,
                                             slice_mut(&mut flag), Stream::DEFAULT)));
    if !device_available() {
        let r = kernels::clip_grad_norm(&mut bufs, 1.0, slice_mut(&mut norm), Stream::DEFAULT);
        assert!(matches!(r, Err(Error::NotAvailable(_))), "{r:?}");
    }
}

#[test]
fn topk_gemm_and_attention_lengths_are_checked() {
    let x = [0.5f32; 20];
    let mut vals = [0f32; 6];
    let mut idx = [0i32; 5];
    assert!(is_invalid(kernels::topk(slice(&x), slice_mut(&mut vals), slice_mut(&mut idx), 2, 10, 3,
                                     Stream::DEFAULT)));
    let mut idx6 = [0i32; 6];
    // k > n is the library's refusal.
    let mut v22 = [0f32; 22];
    let mut i22 = [0i32; 22];
    assert!(is_invalid(kernels::topk(slice(&x), slice_mut(&mut v22), slice_mut(&mut i22), 2, 10, 11,
                                     Stream::DEFAULT)));
    let s = kernels::GemmShape { m: 2, n: 3, k: 4, trans_a: false, trans_b: true, alpha: 1.0,
                                 beta: 0.0 };
    let a = [1f32; 8];
    let b = [1f32; 11];
    let mut c = [0f32; 6];
    assert!(is_invalid(kernels::gemm(slice(&a), slice(&b), slice_mut(&mut c), s, None,
                                     Stream::DEFAULT)));
    let shape = kernels::SequenceShape { batch: 1, seq: 4, heads: 4, kv_heads: 2, head_dim: 8 };
    let q = [0f32; 128];
    let kv = [0f32; 63];
    let mut out = [0f32; 128];
    assert!(is_invalid(kernels::flash_attention(slice(&q), slice(&kv), slice(&kv),
                                                slice_mut(&mut out), shape, 0.35, true,
                                                Stream::DEFAULT)));
    if !device_available() {
        let b12 = [1f32; 12];
        let r = kernels::gemm(slice(&a), slice(&b12), slice_mut(&mut c), s, None, Stream::DEFAULT);
        assert!(matches!(r, Err(Error::NotAvailable(_))), "{r:?}");
        let r = kernels::topk(slice(&x), slice_mut(&mut vals), slice_mut(&mut idx6), 2, 10, 3,
                              Stream::DEFAULT);
        assert!(matches!(r, Err(Error::NotAvailable(_))), "{r:?}");
    }
}

// Per-call sampling (stepgraph_session_prefill_sampled): a +100 bias makes its id every
// greedy and every sampled choice, and nothing of a call stays for the next.
#[test]
fn a_logit_bias_forces_its_id() {
    let mut s = Session::new(None, &cpu(3)).unwrap();
    let prompt = [5, 6, 7];
    let none = HashSet::new();
    let plain = s.generate_until(0, &prompt, 6, &none).unwrap();
    let forced = if plain[0] == 333 { 334 } else { 333 };
    let mut o = SamplingOptions { logit_bias: vec![(forced, 100.0)], ..Default::default() };
    assert_eq!(s.generate_until_with(0, &prompt, 6, &none, &o).unwrap(), vec![forced; 6]);
    o.sampling = Some(Sampling::Sample { temperature: 2.0, top_k: 0, top_p: 1.0 });
    o.seed = 9;
    assert_eq!(s.generate_until_with(0, &prompt, 6, &none, &o).unwrap(), vec![forced; 6]);
    let banned = SamplingOptions { logit_bias: vec![(plain[0], -100.0)], ..Default::default() };
    assert!(!s.generate_until_with(0, &prompt, 6, &none, &banned).unwrap().contains(&plain[0]));
    assert_eq!(s.generate_until(0, &prompt, 6, &none).unwrap(), plain);
}

// A call's temperature is its own: on a greedy session it draws what a sampling session
// draws with the same seed.
#[test]
fn a_calls_temperature_is_its_own() {
    let hot = Sampling::Sample { temperature: 8.0, top_k: 0, top_p: 1.0 };
    let mut greedy = Session::new(None, &cpu(8)).unwrap();
    let mut sampled = Session::new(None, &SessionOptions { sampling: hot, ..cpu(8) }).unwrap();
    let prompt = [11, 12, 13, 14];
    let none = HashSet::new();
    let plain = greedy.generate_until(0, &prompt, 12, &none).unwrap();
    sampled.prefill(0, &prompt, 4).unwrap();
    let want = sampled.generate(0, 12).unwrap();
    let o = SamplingOptions { sampling: Some(hot), seed: 4, ..Default::default() };
    let got = greedy.generate_until_with(0, &prompt, 12, &none, &o).unwrap();
    assert_eq!(got, want);
    assert_ne!(got, plain);
}

// A bad value is refused by the library, naming the field; the session goes on.
#[test]
fn bad_sampling_values_are_refused_by_name() {
    let mut s = Session::new(None, &cpu(1)).unwrap();
    let vocab = s.info().vocab_size as i32;
    let bad = [
        (SamplingOptions { repetition_penalty: 0.0, ..Default::default() }, "repetition_penalty"),
        (SamplingOptions { presence_penalty: 2.5, ..Default::default() }, "presence_penalty"),
        (SamplingOptions { min_p: f32::NAN, ..Default::default() }, "min_p"),
        (SamplingOptions { logit_bias: vec![(vocab, 1.0)], ..Default::default() },
         "logit_bias_ids[0]"),
        (SamplingOptions { logit_bias: vec![(1, 101.0)], ..Default::default() },
         "logit_bias_values[0]"),
        (SamplingOptions { logit_bias: vec![(1, 1.0); 65], ..Default::default() },
         "logit_bias_count"),
        (SamplingOptions { sampling: Some(Sampling::Sample { temperature: 1.0, top_k: -1,
                                                             top_p: 1.0 }),
                           ..Default::default() }, "top_k"),
    ];
    for (o, field) in bad {
        match s.prefill_with(0, &[1, 2, 3], &o) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(field), "{field}: {m}"),
            other => panic!("{field}: {other:?}"),
        }
    }
    s.prefill_with(0, &[1, 2, 3], &SamplingOptions::default()).unwrap();
    assert_eq!(s.generate(0, 2).unwrap().len(), 2);
}
