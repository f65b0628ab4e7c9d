// Finds or builds the C ABI libraries (libstepgraph_c.so, libstepgraph_session_c.so) and
// tells the crate where they are; src/ffi.rs opens them from there at run time (why it does
// not link them: see its header).
//
// The folder is STEPGRAPH_LIB_DIR when set (a build folder, or an installed prefix's lib
// folder), which must hold both, as for the Python package and the Go package. Otherwise
// this script builds them from the repository the crate sits in, with the repository's own
// CMake build (the two library targets only, tests and benchmarks off) in OUT_DIR: with CUDA
// when CMake finds nvcc, CPU-only otherwise (STEPGRAPH_WITH_CUDA=OFF or ON decides instead).
// CMake is run as a command because the `cmake` crate would be a registry dependency, and
// the crate keeps none (builds here are offline). A repository build folder is not searched:
// it may be of another configuration or stale, and the crate's own build is cached by cargo
// (rebuilt incrementally when a source of the libraries changes).
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const LIBS: [&str; 2] = ["libstepgraph_c.so", "libstepgraph_session_c.so"];
// What the two libraries are built from: cargo watches these (a folder: every file in it).
const SOURCES: [&str; 12] = ["CMakeLists.txt", "include", "base", "kernels", "text", "graph",
                             "dispatch", "capture", "models", "runtime", "c_api", "tools/cmake"];

fn has_libs(dir: &Path) -> bool {
    LIBS.iter().all(|l| dir.join(l).is_file())
}

fn run(command: &mut Command, what: &str) {
    let out = command.output().unwrap_or_else(|e| {
        panic!("stepgraph: cannot run {:?} to {what}: {e} (install CMake and Ninja, e.g. \
                tools/deps.sh, or set STEPGRAPH_LIB_DIR to a folder holding {})",
               command.get_program(), LIBS.join(" and "))
    });
    if !out.status.success() {
        // The build's own output, so that the compiler's error is in cargo's report.
        eprintln!("{}", String::from_utf8_lossy(&out.stdout));
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        panic!("stepgraph: {what} failed ({}); its output is above", out.status);
    }
}

fn build_with_cmake(repo: &Path) -> PathBuf {
    if !repo.join("CMakeLists.txt").is_file() || !repo.join("c_api").is_dir() {
        panic!("stepgraph: {} is not the stepgraph repository, so the C libraries cannot be \
                built from it: set STEPGRAPH_LIB_DIR to a folder holding {}",
               repo.display(), LIBS.join(" and "));
    }
    for s in SOURCES {
        println!("cargo:rerun-if-changed={}", repo.join(s).display());
    }
    println!("cargo:rerun-if-env-changed=STEPGRAPH_WITH_CUDA");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR")).join("cmake");
    let cmake = env::var_os("CMAKE").unwrap_or_else(|| "cmake".into());
    let mut configure = Command::new(&cmake);
    configure.arg("-S").arg(repo).arg("-B").arg(&out)
        .args(["-DCMAKE_BUILD_TYPE=Release", "-DSTEPGRAPH_BUILD_TESTS=OFF",
               "-DSTEPGRAPH_BUILD_BENCH=OFF"]);
    // The generator is fixed at the first configure; Ninja when there is one.
    let ninja = Command::new("ninja").arg("--version").output()
        .map_or(false, |o| o.status.success());
    if ninja && !out.join("CMakeCache.txt").exists() {
        configure.args(["-G", "Ninja"]);
    }
    if let Ok(cuda) = env::var("STEPGRAPH_WITH_CUDA") {
        configure.arg(format!("-DSTEPGRAPH_WITH_CUDA={cuda}"));
    }
    run(&mut configure, "configure the stepgraph C libraries");
    let jobs = env::var("NUM_JOBS").unwrap_or_else(|_| "2".to_string());
    run(Command::new(&cmake).arg("--build").arg(&out)
            .args(["--target", "stepgraph_c", "stepgraph_session_c", "-j", &jobs]),
        "build the stepgraph C libraries");
    out
}

fn main() {
    println!("cargo:rerun-if-env-changed=STEPGRAPH_LIB_DIR");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let repo = manifest.parent().expect("rust/ sits in the repository").to_path_buf();
    let dir = match env::var_os("STEPGRAPH_LIB_DIR").filter(|d| !d.is_empty()) {
        Some(d) => {
            let d = PathBuf::from(d);
            if !has_libs(&d) {
                panic!("stepgraph: STEPGRAPH_LIB_DIR={} lacks {}", d.display(), LIBS.join(" or "));
            }
            for l in LIBS {
                println!("cargo:rerun-if-changed={}", d.join(l).display());
            }
            d
        }
        None => build_with_cmake(&repo),
    };
    let dir = dir.canonicalize().unwrap_or(dir);
    let dir = dir.to_str().expect("the libraries' folder is UTF-8").to_string();
    println!("cargo:rustc-env=STEPGRAPH_RUST_LIB_DIR={dir}");
    // For a dependent crate's build script that links C code of its own against the C ABI
    // (DEP_STEPGRAPH_LIB_DIR, DEP_STEPGRAPH_INCLUDE).
    println!("cargo:lib_dir={dir}");
    println!("cargo:include={}", repo.join("include").display());
}
