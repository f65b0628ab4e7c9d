// Text through the session: Session::encode / decode / stop_ids / generate_text against the
// tokenizer fixtures made with transformers (tests/fixtures/tokenizer) and the real
// SmolLM2-135M-Instruct file (tests/fixtures/fetch_smollm2.sh; its cases skip, saying so,
// without it), and the refusals: no tokenizer, text that is not UTF-8, ids outside the
// vocabulary, flags that do not go together.
use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use stepgraph::*;

// ---- a small JSON reader for the fixtures (the crate is std only) ----------------------

#[derive(Clone, Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl Json {
    fn parse(text: &str) -> Json {
        let mut p = Parser { s: text.as_bytes(), i: 0 };
        let v = p.value();
        p.ws();
        assert_eq!(p.i, p.s.len(), "trailing bytes in JSON");
        v
    }
    fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(m) => m.get(key).unwrap_or_else(|| panic!("no key {key}")),
            _ => panic!("not an object"),
        }
    }
    fn has(&self, key: &str) -> bool {
        matches!(self, Json::Obj(m) if m.contains_key(key))
    }
    fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(v) => v,
            _ => panic!("not an array"),
        }
    }
    fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            _ => panic!("not a string"),
        }
    }
    fn bool(&self) -> bool {
        match self {
            Json::Bool(b) => *b,
            _ => panic!("not a bool"),
        }
    }
    fn ids(&self) -> Vec<i32> {
        self.arr()
            .iter()
            .map(|v| match v {
                Json::Num(n) => *n as i32,
                _ => panic!("not a number"),
            })
            .collect()
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && b" \t\r\n".contains(&self.s[self.i]) {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) {
        self.ws();
        assert_eq!(self.s[self.i], c, "JSON: expected {} at {}", c as char, self.i);
        self.i += 1;
    }
    fn value(&mut self) -> Json {
        self.ws();
        match self.s[self.i] {
            b'{' => {
                self.i += 1;
                let mut m = BTreeMap::new();
                self.ws();
                if self.s[self.i] == b'}' {
                    self.i += 1;
                    return Json::Obj(m);
                }
                loop {
                    self.ws();
                    let k = self.string();
                    self.eat(b':');
                    let v = self.value();
                    m.insert(k, v);
                    self.ws();
                    self.i += 1;
                    if self.s[self.i - 1] == b'}' {
                        return Json::Obj(m);
                    }
                }
            }
            b'[' => {
                self.i += 1;
                let mut v = Vec::new();
                self.ws();
                if self.s[self.i] == b']' {
                    self.i += 1;
                    return Json::Arr(v);
                }
                loop {
                    v.push(self.value());
                    self.ws();
                    self.i += 1;
                    if self.s[self.i - 1] == b']' {
                        return Json::Arr(v);
                    }
                }
            }
            b'"' => Json::Str(self.string()),
            b't' => {
                self.i += 4;
                Json::Bool(true)
            }
            b'f' => {
                self.i += 5;
                Json::Bool(false)
            }
            b'n' => {
                self.i += 4;
                Json::Null
            }
            _ => {
                let start = self.i;
                while self.i < self.s.len() && b"+-.eE0123456789".contains(&self.s[self.i]) {
                    self.i += 1;
                }
                let t = std::str::from_utf8(&self.s[start..self.i]).unwrap();
                Json::Num(t.parse().unwrap_or_else(|_| panic!("JSON number {t}")))
            }
        }
    }
    fn hex4(&mut self) -> u32 {
        let t = std::str::from_utf8(&self.s[self.i..self.i + 4]).unwrap();
        self.i += 4;
        u32::from_str_radix(t, 16).unwrap()
    }
    fn string(&mut self) -> String {
        assert_eq!(self.s[self.i], b'"');
        self.i += 1;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let c = self.s[self.i];
            self.i += 1;
            match c {
                b'"' => return String::from_utf8(out).expect("JSON strings are UTF-8"),
                b'\\' => {
                    let e = self.s[self.i];
                    self.i += 1;
                    let ch = match e {
                        b'n' => '\n',
                        b't' => '\t',
                        b'r' => '\r',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'u' => {
                            let mut cp = self.hex4();
                            if (0xD800..0xDC00).contains(&cp) {
                                assert_eq!(&self.s[self.i..self.i + 2], b"\\u");
                                self.i += 2;
                                let lo = self.hex4();
                                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                            }
                            char::from_u32(cp).expect("a JSON escape of a character")
                        }
                        other => other as char,  // \" \\ \/
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                _ => out.push(c),
            }
        }
    }
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn read_json(path: &Path) -> Json {
    Json::parse(&fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

fn cpu(max_seq: i64) -> SessionOptions {
    SessionOptions { backend: Backend::Cpu, max_seq, ..SessionOptions::default() }
}

// ---- a model folder with a tokenizer, made from fixtures --------------------------------

// The f32_gqa fixture model with the bl_smollm fixture tokenizer (a byte-level BPE of 700
// tokens trained like SmolLM's, ChatML specials at 0..2) and SmolLM2's chat template.
struct TextFolder(PathBuf);

impl TextFolder {
    fn new(name: &str) -> TextFolder {
        let dir = std::env::temp_dir().join(format!("sg_rust_{name}_{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let f = fixtures();
        for (from, to) in [
            ("f32_gqa/config.json", "config.json"),
            ("f32_gqa/generation_config.json", "generation_config.json"),
            ("f32_gqa/model.safetensors", "model.safetensors"),
            ("tokenizer/bl_smollm/tokenizer.json", "tokenizer.json"),
            ("tokenizer/bl_smollm/tokenizer_config.json", "tokenizer_config.json"),
            ("tokenizer/chat/smollm2.jinja", "chat_template.jinja"),
        ] {
            fs::copy(f.join(from), dir.join(to)).unwrap();
        }
        TextFolder(dir)
    }
}

impl Drop for TextFolder {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn corpus() -> Vec<String> {
    let corpus = read_json(&fixtures().join("tokenizer/corpus.json"));
    corpus.arr().iter().map(|s| s.str().to_string()).collect()
}

#[test]
fn text_round_trips_as_transformers_does() {
    let folder = TextFolder::new("round_trip");
    let mut s = Session::new(Some(&folder.0), &cpu(64)).unwrap();
    let expected = read_json(&fixtures().join("tokenizer/bl_smollm/expected.json"));
    let different = expected.get("decoded_where_different");
    let texts = corpus();
    assert_eq!(texts.len(), expected.get("ids").arr().len());
    let mut same = 0;
    for (i, text) in texts.iter().enumerate() {
        let ids = s.encode(text, &EncodeOptions::default()).unwrap();
        assert_eq!(ids, expected.get("ids").arr()[i].ids(), "#{i} {text:?}");
        let back = s.decode(&ids, false).unwrap();
        let key = i.to_string();
        let want = if different.has(&key) { different.get(&key).str() } else { text.as_str() };
        assert_eq!(back, want, "#{i}");
        same += (back == *text) as usize;
    }
    assert!(same >= 300, "{same} round trips");
    // The options reach the tokenizer: a special token in the text is one id, or text.
    let parsed = s.encode("a<|im_end|>b", &EncodeOptions::default()).unwrap();
    let literal_options = EncodeOptions { parse_special: false, ..Default::default() };
    let literal = s.encode("a<|im_end|>b", &literal_options).unwrap();
    assert!(parsed.contains(&2) && !literal.contains(&2), "{parsed:?} {literal:?}");
    assert_eq!(s.decode(&parsed, false).unwrap(), "a<|im_end|>b");
    assert_eq!(s.decode(&parsed, true).unwrap(), "ab");
    // Text longer than the first guess of the buffer: the size query path.
    let long = vec![1i32; 300]; // <|im_start|>, 12 bytes each
    assert_eq!(s.decode(&long, false).unwrap(), "<|im_start|>".repeat(300));
}

#[test]
fn chat_turns_are_the_templates_and_stop_at_its_end_of_turn() {
    let folder = TextFolder::new("chat");
    let mut s = Session::new(Some(&folder.0), &cpu(64)).unwrap();
    let cases = read_json(&fixtures().join("tokenizer/chat/expected.json"));
    for c in cases.get("smollm2").get("cases").arr() {
        let ids = s.encode(c.get("user").str(), &EncodeOptions::chat()).unwrap();
        assert_eq!(s.decode(&ids, false).unwrap(), c.get("text").str());
    }
    assert_eq!(s.stop_ids(false).unwrap(), Vec::<i32>::new());
    assert_eq!(s.stop_ids(true).unwrap(), vec![2]);
}

// Whole conversations (system message, earlier turns) through the template, as
// transformers rendered them (the template fixtures, generation prompt added).
#[test]
fn conversations_render_as_transformers_renders_them() {
    let folder = TextFolder::new("conversations");
    let mut s = Session::new(Some(&folder.0), &cpu(96)).unwrap();
    let fixture = read_json(&fixtures().join("chat_templates/expected.json"));
    let mut several = 0;
    for c in fixture.get("templates").get("tokenizer/chat/smollm2.jinja").get("cases").arr() {
        if !c.get("add_generation_prompt").bool() {
            continue;
        }
        let messages: Vec<ChatMessage> = c.get("messages").arr().iter()
            .map(|m| ChatMessage { role: m.get("role").str(), content: m.get("content").str() })
            .collect();
        let ids = s.encode_chat(&messages).unwrap();
        assert_eq!(s.decode(&ids, false).unwrap(), c.get("text").str(), "{messages:?}");
        several += (messages.len() > 1) as i32;
    }
    assert!(several >= 2, "{several} conversations of several messages");
    // Quotes, backslashes and control characters reach the template as written.
    let odd = "say \"hi\" \\ then\n\ttab \u{1}";
    let one = s.encode_chat(&[ChatMessage { role: "user", content: odd }]).unwrap();
    assert_eq!(one, s.encode(odd, &EncodeOptions::chat()).unwrap());
    match s.encode_chat(&[]) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("no messages"), "{m}"),
        other => panic!("no messages: {other:?}"),
    }
}

#[test]
fn bad_text_and_ids_are_refused_with_messages() {
    let folder = TextFolder::new("bad");
    let mut s = Session::new(Some(&folder.0), &cpu(64)).unwrap();
    for bad in [&b"ab\xff"[..], b"\xe2\x82", b"\xc0\xaf", b"x\xed\xa0\x80y"] {
        match s.encode_bytes(bad, &EncodeOptions::default()) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("UTF-8"), "{m}"),
            r => panic!("{bad:?}: {r:?}"),
        }
    }
    let good = s.encode("Hello world", &EncodeOptions::default()).unwrap();
    for id in [700, -1, i32::MAX] {
        let mut ids = good.clone();
        ids.insert(1, id);
        match s.decode(&ids, false) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(&id.to_string()), "{m}"),
            r => panic!("{id}: {r:?}"),
        }
    }
    let chat_literal = EncodeOptions { chat: true, parse_special: false, add_special: true };
    assert!(matches!(s.encode("hi", &chat_literal), Err(Error::InvalidArgument(_))));
    // A failure leaves the session usable.
    assert_eq!(s.decode(&good, false).unwrap(), "Hello world");
    assert_eq!(s.encode("", &EncodeOptions::default()).unwrap(), Vec::<i32>::new());
    assert_eq!(s.decode(&[], false).unwrap(), "");
}

#[test]
fn a_model_without_a_tokenizer_says_so() {
    let ids_only = fixtures().join("f32_gqa");
    for model in [None, Some(ids_only.as_path())] {
        let mut s = Session::new(model, &cpu(32)).unwrap();
        let e = s.encode("hello", &EncodeOptions::default()).unwrap_err();
        assert!(matches!(e, Error::NoTokenizer(_)), "{e:?}");
        assert_eq!(e.code(), consts::STEPGRAPH_ERROR_NO_TOKENIZER);
        let want = if model.is_none() { "built-in" } else { "tokenizer.json" };
        assert!(e.message().contains(want), "{}", e.message());
        assert!(e.to_string().contains("no tokenizer"), "{e}");
        assert!(matches!(s.decode(&[1, 2], false), Err(Error::NoTokenizer(_))));
        assert!(matches!(s.stop_ids(true), Err(Error::NoTokenizer(_))));
        assert_eq!(s.stop_ids(false).unwrap(), Vec::<i32>::new());
        // Ids still run.
        s.prefill(0, &[3, 4, 5], 0).unwrap();
        assert_eq!(s.generate(0, 2).unwrap().len(), 2);
    }
}

// ---- the real SmolLM2 file ----------------------------------------------------------------

fn smollm2() -> Option<PathBuf> {
    let cache = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/nonexistent".into()))
            .join(".cache"),
    };
    let path = cache.join("stepgraph-test/SmolLM2-135M-Instruct.Q4_1.gguf");
    if path.is_file() {
        Some(path)
    } else {
        eprintln!("skipped: {} is absent: run tests/fixtures/fetch_smollm2.sh", path.display());
        None
    }
}

#[test]
fn smollm2_text_is_transformers() {
    let Some(path) = smollm2() else { return };
    let mut s = Session::new(Some(&path), &cpu(64)).unwrap();
    let expected = read_json(&fixtures().join("tokenizer/smollm2.expected.json"));
    for (i, text) in corpus().iter().enumerate() {
        assert_eq!(s.encode(text, &EncodeOptions::default()).unwrap(),
                   expected.get("ids").arr()[i].ids(), "#{i} {text:?}");
    }
    let im_end = s.encode("<|im_end|>", &EncodeOptions::default()).unwrap();
    assert_eq!(im_end.len(), 1);
    assert_eq!(s.stop_ids(false).unwrap(), im_end);
    assert_eq!(s.stop_ids(true).unwrap(), im_end);
}

// Under the sanitizers (tools/test.sh sets STEPGRAPH_TEST_SANITIZED) the CPU reference runs
// about ten times slower: the model tests there leave out their longest generation.
fn sanitized() -> bool {
    std::env::var_os("STEPGRAPH_TEST_SANITIZED").is_some()
}

// Greedy text on the CPU reference: the prompt's ids, the 32 new ids and their text are
// transformers' (tests/fixtures/smollm2/expected.json).
#[test]
fn smollm2_generates_transformers_text() {
    let Some(path) = smollm2() else { return };
    let mut s = Session::new(Some(&path), &cpu(80)).unwrap();
    let fixture = read_json(&fixtures().join("smollm2/expected.json"));
    let cases = fixture.get("cases").arr();
    for c in cases {
        let options =
            if c.get("chat").bool() { EncodeOptions::chat() } else { EncodeOptions::default() };
        assert_eq!(s.encode(c.get("text").str(), &options).unwrap(), c.get("prompt_ids").ids());
    }
    // The chat case: 32 ids without stopping, then the same prompt stopping at <|im_end|>.
    let chat = cases.iter().find(|c| c.get("chat").bool()).expect("a chat case");
    let generated = chat.get("generated").ids();
    if !sanitized() {
        let text = s.generate_text(0, chat.get("text").str(), &EncodeOptions::chat(),
                                   generated.len(), false).unwrap();
        assert_eq!(text, chat.get("generated_text").str());
    }
    let stops: HashSet<i32> = s.stop_ids(true).unwrap().into_iter().collect();
    let end = generated.iter().position(|id| stops.contains(id)).expect("the fixture stops");
    let stopped = s.generate_text(0, chat.get("text").str(), &EncodeOptions::chat(),
                                  generated.len(), true).unwrap();
    assert_eq!(stopped, s.decode(&generated[..end], true).unwrap());
    assert_eq!(stopped, "The capital of France is Paris.");
    // The same question as a conversation of one message.
    let asked = [ChatMessage { role: "user", content: chat.get("text").str() }];
    assert_eq!(s.generate_chat(0, &asked, generated.len(), true).unwrap(), stopped);
}
