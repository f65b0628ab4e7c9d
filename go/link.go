package stepgraph

// Where the C libraries are found: the headers from the repository this package sits in,
// and libstepgraph_c.so and libstepgraph_session_c.so from its build folders, in the order
// the other bindings search them (build/cuda, build/nocuda, build). Each folder goes into
// the rpath too, so a program that links this package runs without LD_LIBRARY_PATH, finding
// the libraries where they were at build time. A linker ignores -L folders that do not
// exist, and the loader rpath entries that do not.
//
// Another folder (STEPGRAPH_LIB_DIR, as for the Python and Rust bindings): cgo directives
// cannot read the environment, so the go command takes it through CGO_LDFLAGS, whose flags
// come before these on the link line and in the rpath (go/README.md):
//
//	CGO_LDFLAGS="-L$STEPGRAPH_LIB_DIR -Wl,-rpath,$STEPGRAPH_LIB_DIR" go build ...
//
// A program built without it would run on the repository's libraries while the variable
// names others; CheckLibraries finds that, and opening a session refuses it.

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#cgo LDFLAGS: -L${SRCDIR}/../build/cuda -Wl,-rpath,${SRCDIR}/../build/cuda
#cgo LDFLAGS: -L${SRCDIR}/../build/nocuda -Wl,-rpath,${SRCDIR}/../build/nocuda
#cgo LDFLAGS: -L${SRCDIR}/../build -Wl,-rpath,${SRCDIR}/../build
#cgo LDFLAGS: -lstepgraph_session_c -lstepgraph_c -ldl

#define _GNU_SOURCE
#include <dlfcn.h>
#include "stepgraph/c_api/c_session.h"

// The file a function was loaded from ("" when the loader cannot say).
static const char* sg_loaded_from(const void* function) {
  Dl_info info;
  if (dladdr(function, &info) == 0 || info.dli_fname == NULL) return "";
  return info.dli_fname;
}
static const char* sg_kernels_file(void) {
  return sg_loaded_from((const void*)&stepgraph_abi_version);
}
static const char* sg_sessions_file(void) {
  return sg_loaded_from((const void*)&stepgraph_session_abi_version);
}
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// LibraryFiles says which files the loader took the kernel and the session libraries from:
// the folder CGO_LDFLAGS named, or one of the repository's build folders.
func LibraryFiles() (kernels, sessions string) {
	return C.GoString(C.sg_kernels_file()), C.GoString(C.sg_sessions_file())
}

var libraries struct {
	sync.Mutex
	dir string // STEPGRAPH_LIB_DIR when err was found
	err error
	ok  bool // err is the answer for dir
}

// CheckLibraries is nil unless STEPGRAPH_LIB_DIR names a folder whose libraries are not
// the ones this program loaded (it was linked without CGO_LDFLAGS naming the folder). The
// error says which files were loaded and how to link the folder's. Session opening calls
// it; programs using only the kernels may call it once at start.
func CheckLibraries() error {
	dir := os.Getenv("STEPGRAPH_LIB_DIR")
	if dir == "" {
		return nil
	}
	libraries.Lock()
	defer libraries.Unlock()
	if !libraries.ok || libraries.dir != dir {
		libraries.dir, libraries.err, libraries.ok = dir, librariesFrom(dir), true
	}
	return libraries.err
}

func librariesFrom(dir string) error {
	kernels, sessions := LibraryFiles()
	for _, loaded := range []string{kernels, sessions} {
		if loaded == "" {
			continue // the loader cannot say; nothing to compare
		}
		got, err := filepath.EvalSymlinks(loaded)
		if err != nil {
			got = loaded
		}
		want, err := filepath.EvalSymlinks(filepath.Join(dir, filepath.Base(loaded)))
		if err != nil || want != got {
			return &Error{Code: C.STEPGRAPH_ERROR_INVALID_VALUE, Func: "STEPGRAPH_LIB_DIR",
				Message: fmt.Sprintf("it names %s, but this program loaded %s: cgo cannot "+
					"read the variable, so link the folder with CGO_LDFLAGS=\"-L%s "+
					"-Wl,-rpath,%s\" (go/README.md)", dir, loaded, dir, dir)}
		}
	}
	return nil
}
