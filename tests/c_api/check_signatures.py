#!/usr/bin/env python3
"""The C ABI headers are the one source of truth for the signatures: this check reads every
function of include/stepgraph/c_api/c_api.h and c_session.h (the declarations the build's list
reads, see c_api/c_api_list.cmake), the structs of c_session.h and the integer
constants, and compares them, argument by argument (name and type), with the Python
declarations (python/src/stepgraph/_lib.py), the Rust ones (rust/src/ffi.rs) and Go's raw cgo
layer (go/raw.go). A swapped or retyped argument links fine and corrupts memory at run time;
here it fails CI.

Usage: check_signatures.py [repository root]. Exit status 1 and one line per mismatch.
"""

import ctypes
import importlib.util
import os
import re
import sys

HEADERS = ("include/stepgraph/c_api/c_api.h", "include/stepgraph/c_api/c_session.h")

_DECL = re.compile(r"STEPGRAPH_C_(?:EXPORT|HOST) ([^;#]*?)\b(stepgraph_[a-z0-9_]+) ?\((.*?)\) "
                   r"STEPGRAPH_C_NOEXCEPT;")
_STRUCT = re.compile(r"typedef struct (stepgraph_[a-z_]+) \{(.*?)\} \1;")
_DEFINE = re.compile(r"#define (STEPGRAPH_[A-Z0-9_]+) \(?(?:INT64_C\()?(-?\d+)u?\)?"
                     r"(?: << (\d+))?\)?\s*$", re.M)
# Float constants (a limit such as the smallest sampling temperature), written 1e-5f.
_DEFINE_FLOAT = re.compile(r"#define (STEPGRAPH_[A-Z0-9_]+) (-?\d+(?:\.\d*)?(?:e-?\d+)?)f\s*$",
                           re.M)


def _flat(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"\s+", " ", text)


def _ctype(t):
    """A C type as (base, pointer depth, constness of each level's pointee, innermost first):
    'const void*' -> ('void', 1, (True,)), 'void* const*' -> ('void', 2, (False, True))."""
    words = t.replace("*", " * ").split()
    base = [w for w in words if w not in ("const", "*")]
    if len(base) != 1:
        raise ValueError("cannot read the C type %r" % " ".join(words))
    depth = words.count("*")
    # A const before the first '*' is the pointee's; one after the k-th '*' makes that
    # pointer const, the pointee of level k. A const on the outermost pointer (a const
    # parameter) is not part of the type a caller sees.
    consts = [False] * (depth + 1)
    stars = 0
    for w in words:
        if w == "*":
            stars += 1
        elif w == "const":
            consts[stars] = True
    return base[0], depth, tuple(consts[:depth])


def _param(p):
    m = re.match(r"^(.*?)([A-Za-z_][A-Za-z0-9_]*)$", p.strip())
    if not m:
        raise ValueError("cannot read the parameter %r" % p)
    return m.group(2), _ctype(m.group(1))


def read_headers(root):
    """{name: (return type, [(argument name, C type)])}, {struct: [(field, C type)]}, {define: int}"""
    functions, structs, defines = {}, {}, {}
    for h in HEADERS:
        raw = open(os.path.join(root, h), encoding="utf-8").read()
        for name, value, shift in _DEFINE.findall(raw):
            defines[name] = int(value) << int(shift) if shift else int(value)
        for name, value in _DEFINE_FLOAT.findall(raw):
            defines[name] = float(value)
        text = _flat(raw)
        for ret, name, params in _DECL.findall(text):
            args = [] if params.strip() == "void" else [_param(p) for p in params.split(",")]
            functions[name] = (_ctype(ret.strip()), args)
        for name, body in _STRUCT.findall(text):
            structs[name] = [_param(f) for f in body.split(";") if f.strip()]
    if not functions:
        raise ValueError("no declarations found in %s" % ", ".join(HEADERS))
    return functions, structs, defines


# ---- Python (ctypes) -------------------------------------------------------------------

_CTYPES = {"int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "uint32_t": ctypes.c_uint32,
           "uint64_t": ctypes.c_uint64, "float": ctypes.c_float}


def _expected_ctype(t, lib):
    base, depth, _ = t
    if depth == 0:
        return None if base == "void" else _CTYPES[base]
    if base == "char" and depth == 1:
        return ctypes.c_char_p
    if base in ("void", "stepgraph_session") and depth == 1:
        return ctypes.c_void_p  # opaque
    if base == "stepgraph_session" and depth == 2:
        return ctypes.POINTER(ctypes.c_void_p)
    if base == "void" and depth == 2:
        return ctypes.POINTER(ctypes.c_void_p)
    if depth == 1 and base == "stepgraph_session_options":
        return ctypes.POINTER(lib.SessionOptions)
    if depth == 1 and base == "stepgraph_session_info":
        return ctypes.POINTER(lib.SessionInfo)
    if depth == 1 and base == "stepgraph_sampling":
        return ctypes.POINTER(lib.Sampling)
    if depth == 1:
        return ctypes.POINTER(_CTYPES[base])
    raise ValueError("no ctypes type for %r" % (t,))


def check_python(functions, structs, defines, lib):
    problems = []
    decls = lib.DECLARATIONS
    for name in sorted(set(functions) | set(decls)):
        if name not in decls:
            problems.append("python: %s is missing from DECLARATIONS" % name)
            continue
        if name not in functions:
            problems.append("python: %s is declared but is in no header" % name)
            continue
        ret, args = functions[name]
        py_ret, py_args = decls[name]
        if _expected_ctype(ret, lib) is not py_ret:
            problems.append("python: %s returns %r, the header says %r" % (name, py_ret, ret))
        if len(py_args) != len(args):
            problems.append("python: %s has %d arguments, the header %d"
                            % (name, len(py_args), len(args)))
        for i, ((cn, ct), (pn, pt)) in enumerate(zip(args, py_args)):
            if cn != pn:
                problems.append("python: %s argument %d is %r, the header's is %r"
                                % (name, i, pn, cn))
            if _expected_ctype(ct, lib) is not pt:
                problems.append("python: %s argument %d (%s) is %r, the header says %s"
                                % (name, i, cn, pt, ct))
    for cname, pyname in (("stepgraph_session_options", "SessionOptions"),
                          ("stepgraph_session_info", "SessionInfo"),
                          ("stepgraph_sampling", "Sampling")):
        fields = getattr(lib, pyname)._fields_
        want = [(n, _expected_ctype(t, lib)) for n, t in structs.get(cname, [])]
        if [(n, t) for n, t in fields] != want:
            problems.append("python: %s fields %s, the header's %s" % (pyname, fields, want))
    for name, value in defines.items():
        short = name[len("STEPGRAPH_"):]
        if hasattr(lib, short) and getattr(lib, short) != value:
            problems.append("python: %s = %r, the header's %s = %r"
                            % (short, getattr(lib, short), name, value))
    for short in ("C_API_VERSION", "SESSION_API_VERSION"):
        if not hasattr(lib, short):
            problems.append("python: %s is missing" % short)
    return problems


# ---- Rust ------------------------------------------------------------------------------

_RUST = {"int32_t": "i32", "int64_t": "i64", "uint32_t": "u32", "uint64_t": "u64",
         "float": "f32", "void": "c_void", "char": "c_char"}


def _expected_rust(t):
    base, depth, consts = t
    r = _RUST.get(base, base)
    if depth == 0:
        return None if base == "void" else r
    for level in range(depth):
        r = ("*const " if consts[level] else "*mut ") + r
    return r


def read_rust(text):
    """{name: (return type or None, [(name, type)])}, {struct: [(field, type)]}, {const: int}"""
    text = re.sub(r"//[^\n]*", "", text)
    flat = re.sub(r"\s+", " ", text)
    functions, structs, consts = {}, {}, {}
    for name, params, ret in re.findall(r"pub fn (stepgraph_[a-z0-9_]+)\((.*?)\)(?: -> ([^;]+))?;",
                                        flat):
        args = []
        for p in [p for p in params.split(",") if p.strip()]:
            n, t = p.split(":", 1)
            args.append((n.strip(), t.strip()))
        functions[name] = (ret.strip() if ret else None, args)
    for name, body in re.findall(r"pub struct (stepgraph_[a-z_]+) \{(.*?)\}", flat):
        fields = []
        for f in [f for f in body.split(",") if f.strip()]:
            n, t = f.split(":", 1)
            n = n.replace("pub", "").strip()
            if not n.startswith("_"):
                fields.append((n, t.strip()))
        structs[name] = fields
    for name, value in re.findall(r"pub const (STEPGRAPH_[A-Z0-9_]+): \w+ = ([^;]+);", flat):
        v = value.strip()
        m = re.match(r"^(-?\d+) << (\d+)$", v)
        consts[name] = int(m.group(1)) << int(m.group(2)) if m else \
            (float(v) if re.search(r"[.e]", v) else int(v))
    return functions, structs, consts


def check_rust(functions, structs, defines, rust_text):
    problems = []
    rfun, rstruct, rconst = read_rust(rust_text)
    for name in sorted(set(functions) | set(rfun)):
        if name not in rfun:
            problems.append("rust: %s is missing from ffi.rs" % name)
            continue
        if name not in functions:
            problems.append("rust: %s is declared but is in no header" % name)
            continue
        ret, args = functions[name]
        r_ret, r_args = rfun[name]
        if _expected_rust(ret) != r_ret:
            problems.append("rust: %s returns %s, the header says %s" % (name, r_ret, ret))
        if len(r_args) != len(args):
            problems.append("rust: %s has %d arguments, the header %d"
                            % (name, len(r_args), len(args)))
        for i, ((cn, ct), (rn, rt)) in enumerate(zip(args, r_args)):
            if cn != rn:
                problems.append("rust: %s argument %d is %r, the header's is %r" % (name, i, rn, cn))
            if _expected_rust(ct) != rt:
                problems.append("rust: %s argument %d (%s) is %s, the header says %s"
                                % (name, i, cn, rt, _expected_rust(ct)))
    for sname, fields in structs.items():
        want = [(n, _expected_rust(t)) for n, t in fields]
        if rstruct.get(sname) != want:
            problems.append("rust: struct %s is %s, the header's %s" % (sname, rstruct.get(sname), want))
    for name, value in defines.items():
        if name.endswith("_H_"):
            continue
        if name not in rconst:
            problems.append("rust: the constant %s is missing" % name)
        elif rconst[name] != value:
            problems.append("rust: %s = %r, the header's %r" % (name, rconst[name], value))
    return problems



# ---- Go (cgo) --------------------------------------------------------------------------
# go/raw.go has one unexported Go function per C function, named as it, whose parameters
# are the header's names with Go types, and whose body passes them, in order, to the C
# function (cgo compiles that call against the header itself, so a C type that changes
# fails the build; a swap between two arguments of one type does not, and is caught here).
# The Go constants are the header's macros through cgo (C.STEPGRAPH_*), so they cannot
# drift; the structs are mirrored field by field.

_GO = {"int32_t": "int32", "int64_t": "int64", "uint32_t": "uint32", "uint64_t": "uint64",
       "float": "float32"}
_GO_OPAQUE = {"stepgraph_session": "sessionHandle", "stepgraph_session_options": "sessionOptions",
              "stepgraph_session_info": "sessionInfo", "stepgraph_sampling": "sessionSampling",
              "char": "byte"}


def _expected_go(t):
    """The Go type of a C type in raw.go (Go has no const: constness is not compared)."""
    base, depth, _ = t
    if depth == 0:
        return None if base == "void" else _GO[base]
    if base == "void":
        return "*" * (depth - 1) + "unsafe.Pointer"
    return "*" * depth + _GO_OPAQUE.get(base, _GO.get(base, base))


def _go_params(text):
    """'a, b unsafe.Pointer, n int64' -> [('a', 'unsafe.Pointer'), ('b', ...), ('n', 'int64')]"""
    params, pending = [], []
    for p in [p.strip() for p in text.split(",") if p.strip()]:
        words = p.split()
        if len(words) == 1:
            pending.append(words[0])  # a name whose type comes with a later one
            continue
        for n in pending + [words[0]]:
            params.append((n, " ".join(words[1:])))
        pending = []
    if pending:
        raise ValueError("cannot read the Go parameters %r" % text)
    return params


def _go_call_args(body, name):
    """The argument expressions of the call C.<name>(...) in a function body."""
    start = body.find("C.%s(" % name)
    if start < 0:
        return None
    i = start + len("C.%s(" % name)
    depth, args, cur = 1, [], ""
    while depth:
        c = body[i]
        i += 1
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if not depth:
                break
        if c == "," and depth == 1:
            args.append(cur.strip())
            cur = ""
        else:
            cur += c
    if cur.strip():
        args.append(cur.strip())
    return args


def read_go(text):
    """{name: (return type or None, [(name, type)], [argument expressions])},
    {struct: [(field, type)]}"""
    text = re.sub(r"//[^\n]*", "", text)
    flat = re.sub(r"\s+", " ", text)
    functions, structs = {}, {}
    for m in re.finditer(r"func (stepgraph_[a-z0-9_]+)\((.*?)\) ?([^{]*)\{(.*?)\n\}",
                         re.sub(r"[ \t]+", " ", text), re.S):
        name, params, ret, body = m.groups()
        params = re.sub(r"\s+", " ", params)
        body = re.sub(r"\s+", " ", body)
        functions[name] = (ret.strip() or None, _go_params(params), _go_call_args(body, name))
    for name, body in re.findall(r"type (session[A-Za-z]+) struct \{(.*?)\}", flat):
        fields = []
        for f in re.findall(r"([A-Za-z_][A-Za-z0-9_]*) ([A-Za-z0-9_.*]+)", body):
            fields.append(f)
        structs[name] = fields
    return functions, structs


def _go_arg_names(expr):
    """The Go identifiers an argument expression names, leaving out cgo's types and
    conversions: '(*C.int32_t)(unsafe.Pointer(ids))' -> ['ids']."""
    expr = re.sub(r"\bC\.[A-Za-z0-9_]+", "", expr)
    expr = expr.replace("unsafe.Pointer", "")
    return re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expr)


def check_go(functions, structs, go_text, other_go_texts=()):
    problems = []
    gfun, gstruct = read_go(go_text)
    for name in sorted(set(functions) | set(gfun)):
        if name not in gfun:
            problems.append("go: %s is missing from raw.go" % name)
            continue
        if name not in functions:
            problems.append("go: %s is declared but is in no header" % name)
            continue
        ret, args = functions[name]
        g_ret, g_args, g_call = gfun[name]
        if _expected_go(ret) != g_ret:
            problems.append("go: %s returns %s, the header says %s" % (name, g_ret, ret))
        if len(g_args) != len(args):
            problems.append("go: %s has %d arguments, the header %d"
                            % (name, len(g_args), len(args)))
        for i, ((cn, ct), (gn, gt)) in enumerate(zip(args, g_args)):
            if cn != gn:
                problems.append("go: %s argument %d is %r, the header's is %r" % (name, i, gn, cn))
            if _expected_go(ct) != gt:
                problems.append("go: %s argument %d (%s) is %s, the header says %s"
                                % (name, i, cn, gt, _expected_go(ct)))
        if g_call is None:
            problems.append("go: %s does not call C.%s" % (name, name))
            continue
        if len(g_call) != len(g_args):
            problems.append("go: %s passes %d arguments to C.%s, it takes %d"
                            % (name, len(g_call), name, len(g_args)))
        for i, (expr, (gn, _)) in enumerate(zip(g_call, g_args)):
            if _go_arg_names(expr) != [gn]:
                problems.append("go: %s passes %r as C argument %d, not its parameter %r"
                                % (name, expr, i, gn))
    for cname, gname in (("stepgraph_session_options", "sessionOptions"),
                         ("stepgraph_session_info", "sessionInfo"),
                         ("stepgraph_sampling", "sessionSampling")):
        want = [(n, _expected_go(t)) for n, t in structs.get(cname, [])]
        if gstruct.get(gname) != want:
            problems.append("go: struct %s is %s, the header's %s is %s"
                            % (gname, gstruct.get(gname), cname, want))
    # raw.go is the one place that calls the C functions.
    for path, text in other_go_texts:
        for name in sorted(set(re.findall(r"\bC\.(stepgraph_[a-z0-9_]+)\(", text))):
            if name in functions:
                problems.append("go: %s calls C.%s directly; call raw.go's %s" % (path, name, name))
    return problems


def read_go_package(root):
    """raw.go's text and [(path, text)] of the package's other Go files (tests left out:
    cgo is not allowed in them)."""
    go_dir = os.path.join(root, "go")
    raw = open(os.path.join(go_dir, "raw.go"), encoding="utf-8").read()
    others = []
    for dirpath, _, files in os.walk(go_dir):
        for f in sorted(files):
            path = os.path.join(dirpath, f)
            if (f.endswith(".go") and not f.endswith("_test.go")
                    and path != os.path.join(go_dir, "raw.go")):
                others.append((os.path.relpath(path, root),
                               open(path, encoding="utf-8").read()))
    return raw, others


def load_python_lib(root):
    spec = importlib.util.spec_from_file_location(
        "stepgraph_lib_decls", os.path.join(root, "python", "src", "stepgraph", "_lib.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # declarations only: loads no library
    return module


def check_all(root):
    functions, structs, defines = read_headers(root)
    problems = check_python(functions, structs, defines, load_python_lib(root))
    rust = open(os.path.join(root, "rust", "src", "ffi.rs"), encoding="utf-8").read()
    problems += check_rust(functions, structs, defines, rust)
    go_raw, go_others = read_go_package(root)
    problems += check_go(functions, structs, go_raw, go_others)
    return functions, problems


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    functions, problems = check_all(root)
    for p in problems:
        print(p)
    if problems:
        return 1
    print("%d functions of %s match python/src/stepgraph/_lib.py, rust/src/ffi.rs and go/raw.go"
          % (len(functions), " and ".join(HEADERS)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
