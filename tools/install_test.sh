#!/usr/bin/env bash
# The README's "From Python" and "From Rust" sections run as written, as a user on a fresh
# machine would, in a folder outside the repository and with nothing built beforehand:
#   Rust: `cargo new`, `cargo add --path` of rust/, the README's main.rs, `cargo run`: the
#     crate's build script builds the C libraries with CMake; then the program alone, with
#     an empty environment (no LD_LIBRARY_PATH, no STEPGRAPH_LIB_DIR).
#   Python: a venv, `pip install` of python/ (scikit-build-core runs the same CMake build),
#     the README's script, run with an empty environment from a folder that also holds a
#     `stepgraph/` folder (a clone's name), which must not shadow the installed package,
#     nor may the checkout's python/ folder when run from there; then `pip install -e`.
# Both print the SmolLM2 answer (tests/fixtures/fetch_smollm2.sh); without the file, they
# run the built-in model instead and say so.
#
# Usage: tools/install_test.sh [model]. STEPGRAPH_WITH_CUDA=OFF builds the libraries
# without CUDA even where nvcc is (CI does: the CUDA build is tools/test.sh's). pip reuses
# the CMake build folder of the crate's build script (scikit-build-core's build-dir), so
# that the libraries compile once: both are the repository's CMake with the same options.
# pip needs PyPI (scikit-build-core, NumPy); cargo runs offline.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
model=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/stepgraph-test/SmolLM2-135M-Instruct.Q4_1.gguf}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
clean_env=(env -i "PATH=/usr/local/bin:/usr/bin:/bin")

fail() { echo "install_test: $*" >&2; exit 1; }
# Quiet unless a step fails; then its output.
quiet() { "$@" >"$work/log" 2>&1 || { cat "$work/log" >&2; fail "failed: $*"; }; }

# The README's fenced blocks of a language in a section, the checkout's path for
# /path/to/stepgraph: block SECTION LANG INDEX.
block() {
  python3 - "$repo" "$@" <<'PY'
import sys
repo, section, lang, index = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
text = open(repo + "/README.md", encoding="utf-8").read()
text = text[text.index("\n## " + section + "\n") + 1:]
text = text[:text.find("\n## ", 3)] if "\n## " in text[3:] else text
blocks = [p[:p.index("```")] for p in text.split("```" + lang + "\n")[1:]]
sys.stdout.write(blocks[index].replace("/path/to/stepgraph", repo))
PY
}

answer="The capital of France is Paris."
if [[ -f $model ]]; then
  have_model=1
else
  have_model=""
  echo "install_test: $model is absent: the programs run the built-in model" >&2
fi

# ---- Rust -----------------------------------------------------------------------------
echo "== install_test: a crate depending on rust/ by path (cargo new, cargo add, cargo run)" >&2
mkdir "$work/rust"
(
  cd "$work/rust"
  export CARGO_NET_OFFLINE=true
  unset STEPGRAPH_LIB_DIR CARGO_TARGET_DIR LD_LIBRARY_PATH
  block "From Rust" sh 0 >setup.sh
  quiet bash -euo pipefail setup.sh
  block "From Rust" rust 0 >hello/src/main.rs
  cd hello
  if [[ -n $have_model ]]; then
    quiet cargo run -q -- "$model"
    grep -qxF "$answer" "$work/log" || { cat "$work/log" >&2; fail "cargo run printed no answer"; }
    "${clean_env[@]}" target/debug/hello "$model" >"$work/out" 2>&1 ||
      { cat "$work/out" >&2; fail "the program failed without an environment"; }
    grep -qxF "$answer" "$work/out" ||
      { cat "$work/out" >&2; fail "the program printed no answer"; }
  else
    quiet cargo build -q
  fi
  # The built-in model, by the same build: the libraries open without any environment.
  cat >src/main.rs <<'RS'
fn main() {
    let mut s = stepgraph::Session::new(None, &stepgraph::SessionOptions::default()).unwrap();
    println!("{:?}", s.generate_until(0, &[1, 2, 3], 4, &Default::default()).unwrap());
}
RS
  quiet cargo build -q
  "${clean_env[@]}" target/debug/hello >"$work/out" 2>&1 ||
    { cat "$work/out" >&2; fail "the built-in model's program failed without an environment"; }
  if readelf -d target/debug/hello | grep -q "NEEDED.*stepgraph"; then
    fail "the program links the C libraries (it should open them by path)"
  fi
  # Without them it says what it could not open (here: unwrap's panic shows the Err).
  lib=$(ls target/debug/build/stepgraph-*/out/cmake/libstepgraph_session_c.so | head -n1)
  mv "$lib" "$lib.away"
  if "${clean_env[@]}" target/debug/hello >"$work/out" 2>&1; then
    fail "the program ran without its libraries"
  fi
  mv "$lib.away" "$lib"
  grep -q "LibraryNotLoaded(\"cannot open .*libstepgraph_session_c.so" "$work/out" ||
    { cat "$work/out" >&2; fail "the program did not say which library it could not open"; }
)
cmake_dir=$(ls -d "$work"/rust/hello/target/debug/build/stepgraph-*/out/cmake | head -n1)
[[ -f $cmake_dir/CMakeCache.txt ]] || fail "the crate's build script made no CMake build"

# ---- Python ---------------------------------------------------------------------------
echo "== install_test: the Python package installed with pip into a venv" >&2
mkdir "$work/python"
(
  cd "$work/python"
  unset STEPGRAPH_LIB_DIR PYTHONPATH LD_LIBRARY_PATH
  export SKBUILD_BUILD_DIR=$cmake_dir
  if [[ -n ${STEPGRAPH_WITH_CUDA:-} ]]; then
    export SKBUILD_CMAKE_DEFINE="STEPGRAPH_WITH_CUDA=$STEPGRAPH_WITH_CUDA"
  fi
  block "From Python" sh 0 >setup.sh
  quiet bash -euo pipefail setup.sh
  block "From Python" python 0 >hello.py
  # The folder that holds a clone of the repository, named as it usually is.
  ln -s "$repo" stepgraph
  py=("${clean_env[@]}" "$work/python/venv/bin/python")
  # From there, from the checkout and from its python/ (the src layout keeps the package's
  # sources out of the way): the venv's package.
  for d in "$work/python" "$repo" "$repo/python"; do
    where=$(cd "$d" && "${py[@]}" -c 'import stepgraph; print(stepgraph.__file__)')
    [[ $where == "$work/python/venv/"* ]] || fail "import stepgraph in $d found $where"
  done
  for l in libstepgraph_c.so libstepgraph_session_c.so; do
    [[ -f $(dirname "$where")/$l ]] || fail "the installed package lacks $l"
  done
  if [[ -n $have_model ]]; then
    "${py[@]}" hello.py "$model" >"$work/out" 2>&1 ||
      { cat "$work/out" >&2; fail "the README's script failed"; }
    [[ $(head -n1 "$work/out") == "$answer" && $(sed -n 2p "$work/out") == " Paris."* ]] ||
      { cat "$work/out" >&2; fail "the README's script printed no answer"; }
  fi
  "${py[@]}" -c 'import stepgraph; s = stepgraph.Session(backend="cpu", max_seq=8)
assert len(s.generate([1, 2, 3], max_new_tokens=4)) == 4' ||
    fail "the built-in model did not run from the installed package"
  # An editable install: the modules stay in the checkout, the libraries go to site-packages.
  quiet venv/bin/pip install -e "$repo/python"
  "${py[@]}" -c 'import stepgraph; s = stepgraph.Session(backend="cpu", max_seq=8)
assert stepgraph.__file__.startswith("'"$repo"'/python/src/")
assert len(s.generate([1, 2, 3], max_new_tokens=4)) == 4' ||
    fail "the built-in model did not run from an editable install"
)
echo "== install_test: both bindings installed and ran" >&2
