// Links the C ABI libraries that CMake built (libstepgraph_c.so, libstepgraph_session_c.so;
// with STEPGRAPH_WITH_CUDA=OFF they are the same functions without CUDA, see c_api.h). The
// folder is STEPGRAPH_LIB_DIR when set, else the first of the repository's build folders
// (build/cuda, build/nocuda, build) that holds both. The folder goes into the rpath, so
// tests and programs run without LD_LIBRARY_PATH.
use std::env;
use std::path::{Path, PathBuf};

const LIBS: [&str; 2] = ["stepgraph_c", "stepgraph_session_c"];

fn has_libs(dir: &Path) -> bool {
    LIBS.iter().all(|l| dir.join(format!("lib{l}.so")).is_file())
}

fn main() {
    println!("cargo:rerun-if-env-changed=STEPGRAPH_LIB_DIR");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let repo = manifest.parent().expect("rust/ sits in the repository").to_path_buf();
    let dir = match env::var_os("STEPGRAPH_LIB_DIR") {
        Some(d) => PathBuf::from(d),
        None => ["build/cuda", "build/nocuda", "build"]
            .iter()
            .map(|s| repo.join(s))
            .find(|d| has_libs(d))
            .unwrap_or_else(|| {
                panic!(
                    "libstepgraph_c.so and libstepgraph_session_c.so not found under {}/build*: \
                     build them with CMake (targets stepgraph_c stepgraph_session_c) or set \
                     STEPGRAPH_LIB_DIR",
                    repo.display()
                )
            }),
    };
    if !has_libs(&dir) {
        panic!("STEPGRAPH_LIB_DIR={} lacks the stepgraph C ABI libraries", dir.display());
    }
    let dir = dir.canonicalize().unwrap_or(dir);
    for l in LIBS {
        println!("cargo:rerun-if-changed={}", dir.join(format!("lib{l}.so")).display());
        println!("cargo:rustc-link-lib=dylib={l}");
    }
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    // Where the signature check finds the headers this crate mirrors.
    println!("cargo:rerun-if-changed={}", repo.join("include/stepgraph/c_api/c_api.h").display());
    println!("cargo:rerun-if-changed={}", repo.join("include/stepgraph/c_api/c_session.h").display());
}
