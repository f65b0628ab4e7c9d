// Package cudart is the few CUDA runtime calls that the tests need to put inputs on a GPU
// and read outputs back: libcudart is opened at run time (dlopen), so that the package
// builds and links without a CUDA toolkit, as the CPU-only build does.
package cudart

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>

typedef int (*sg_malloc_fn)(void**, size_t);
typedef int (*sg_free_fn)(void*);
typedef int (*sg_memcpy_fn)(void*, const void*, size_t, int);
typedef int (*sg_sync_fn)(void);

static void* sg_rt;
static sg_malloc_fn sg_malloc;
static sg_free_fn sg_free;
static sg_memcpy_fn sg_memcpy;
static sg_sync_fn sg_sync;

static int sg_open(const char* name) {
  if (sg_rt != NULL) return 1;
  void* rt = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (rt == NULL) return 0;
  sg_malloc = (sg_malloc_fn)dlsym(rt, "cudaMalloc");
  sg_free = (sg_free_fn)dlsym(rt, "cudaFree");
  sg_memcpy = (sg_memcpy_fn)dlsym(rt, "cudaMemcpy");
  sg_sync = (sg_sync_fn)dlsym(rt, "cudaDeviceSynchronize");
  if (!sg_malloc || !sg_free || !sg_memcpy || !sg_sync) {
    dlclose(rt);
    return 0;
  }
  sg_rt = rt;
  return 1;
}
static int sg_cuda_malloc(void** p, size_t n) { return sg_malloc(p, n); }
static int sg_cuda_free(void* p) { return sg_free(p); }
static int sg_cuda_memcpy(void* d, const void* s, size_t n, int kind) {
  return sg_memcpy(d, s, n, kind);
}
static int sg_cuda_sync(void) { return sg_sync(); }
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"
)

var (
	once    sync.Once
	openErr error
)

// Open loads libcudart (the one the kernel library loaded, when it did): by its names on
// the loader's path, then from $CUDA_HOME/lib64 and /usr/local/cuda/lib64.
func Open() error {
	once.Do(func() {
		names := []string{"libcudart.so.13", "libcudart.so.12", "libcudart.so"}
		for _, dir := range []string{os.Getenv("CUDA_HOME"), "/usr/local/cuda"} {
			if dir != "" {
				names = append(names, filepath.Join(dir, "lib64", "libcudart.so"))
			}
		}
		for _, name := range names {
			c := C.CString(name)
			ok := C.sg_open(c) != 0
			C.free(unsafe.Pointer(c))
			if ok {
				return
			}
		}
		openErr = fmt.Errorf("cudart: cannot load the CUDA runtime (tried %v)", names)
	})
	return openErr
}

func status(code C.int, what string) error {
	if code != 0 {
		return fmt.Errorf("cudart: %s failed with cudaError %d", what, int(code))
	}
	return nil
}

// Malloc is cudaMalloc of at least one byte.
func Malloc(bytes int) (unsafe.Pointer, error) {
	if bytes < 1 {
		bytes = 1
	}
	var p unsafe.Pointer
	err := status(C.sg_cuda_malloc(&p, C.size_t(bytes)), "cudaMalloc")
	return p, err
}

func Free(p unsafe.Pointer) error { return status(C.sg_cuda_free(p), "cudaFree") }

// Upload copies bytes from host memory to the device; Download back. Both wait for the
// device (cudaMemcpy on the default stream).
func Upload(dst, src unsafe.Pointer, bytes int) error {
	return status(C.sg_cuda_memcpy(dst, src, C.size_t(bytes), 1), "cudaMemcpy to the device")
}

func Download(dst, src unsafe.Pointer, bytes int) error {
	return status(C.sg_cuda_memcpy(dst, src, C.size_t(bytes), 2), "cudaMemcpy to the host")
}

func Synchronize() error { return status(C.sg_cuda_sync(), "cudaDeviceSynchronize") }
