# The signature check (tests/c_api/check_signatures.py): the headers, the Python declarations
# and the Rust ones agree today, and the check does catch a swapped or retyped argument.
import ctypes
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location(
    "check_signatures", os.path.join(ROOT, "tests", "c_api", "check_signatures.py"))
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def test_headers_python_and_rust_agree():
    functions, problems = check.check_all(ROOT)
    assert problems == []
    assert "stepgraph_attention" in functions and "stepgraph_session_generate" in functions


def test_a_swapped_python_argument_is_caught():
    functions, structs, defines = check.read_headers(ROOT)
    lib = check.load_python_lib(ROOT)
    ret, args = lib.DECLARATIONS["stepgraph_kv_write"]
    args = list(args)
    args[4], args[5] = args[5], args[4]  # slots <-> kv_heads: both int64, links fine
    lib.DECLARATIONS["stepgraph_kv_write"] = (ret, args)
    problems = check.check_python(functions, structs, defines, lib)
    assert any("stepgraph_kv_write argument 4" in p for p in problems), problems


def test_a_retyped_python_argument_is_caught():
    functions, structs, defines = check.read_headers(ROOT)
    lib = check.load_python_lib(ROOT)
    ret, args = lib.DECLARATIONS["stepgraph_rmsnorm"]
    args = [(n, ctypes.c_double if n == "eps" else t) for n, t in args]
    lib.DECLARATIONS["stepgraph_rmsnorm"] = (ret, args)
    problems = check.check_python(functions, structs, defines, lib)
    assert any("stepgraph_rmsnorm argument 5 (eps)" in p for p in problems), problems


def test_rust_swaps_constness_and_struct_fields_are_caught():
    functions, structs, defines = check.read_headers(ROOT)
    rust = open(os.path.join(ROOT, "rust", "src", "ffi.rs")).read()
    swapped = rust.replace("rows: i64, heads: i64,\n                               kv_heads: i64,",
                           "rows: i64, kv_heads: i64,\n                               heads: i64,")
    assert swapped != rust
    assert any("stepgraph_attention argument 6" in p
               for p in check.check_rust(functions, structs, defines, swapped))
    unconst = rust.replace("pub fn stepgraph_copy(src: *const c_void", "pub fn stepgraph_copy(src: *mut c_void")
    assert unconst != rust
    assert check.check_rust(functions, structs, defines, unconst)
    fields = rust.replace("    pub top_k: i32,\n    pub top_p: f32,", "    pub top_p: f32,\n    pub top_k: i32,")
    assert fields != rust
    assert any("stepgraph_session_options" in p
               for p in check.check_rust(functions, structs, defines, fields))


def test_the_text_functions_are_checked_too():
    functions, structs, defines = check.read_headers(ROOT)
    assert {"stepgraph_session_encode", "stepgraph_session_decode",
            "stepgraph_session_stop_ids"} <= set(functions)
    lib = check.load_python_lib(ROOT)
    ret, args = lib.DECLARATIONS["stepgraph_session_encode"]
    args = list(args)
    args[4], args[6] = args[6], args[4]  # ids <-> count: both pointers, links fine
    lib.DECLARATIONS["stepgraph_session_encode"] = (ret, args)
    problems = check.check_python(functions, structs, defines, lib)
    assert any("stepgraph_session_encode argument 4" in p for p in problems), problems
    rust = open(os.path.join(ROOT, "rust", "src", "ffi.rs")).read()
    readonly = rust.replace("flags: u32, text: *mut c_char", "flags: u32, text: *const c_char")
    assert readonly != rust
    assert any("stepgraph_session_decode argument 4" in p
               for p in check.check_rust(functions, structs, defines, readonly))
    flag = rust.replace("STEPGRAPH_TEXT_SKIP_SPECIAL: u32 = 8",
                        "STEPGRAPH_TEXT_SKIP_SPECIAL: u32 = 4")
    assert flag != rust
    assert any("STEPGRAPH_TEXT_SKIP_SPECIAL" in p
               for p in check.check_rust(functions, structs, defines, flag))
