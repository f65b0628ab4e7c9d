// Kernels compiled at run time: CUDA C++ source (made by codegen.h for the values a plan
// fixes) compiled through NVRTC to a CUBIN for the device's own architecture, cached in
// memory and on disk, loaded and launched through the runtime API.
//
// Two layers, so that everything up to the CUBIN is host work that runs (and is tested)
// without a GPU:
//   CubinCache:       source + options + architecture -> CUBIN bytes. Memory map, then a
//                     folder of files, then NVRTC. No device needed.
//   CudaModuleCache:  the CUBIN loaded per device (cudaLibraryLoadData) and its kernels.
//
// The disk cache is keyed by the source, the options, the architecture, the NVRTC version
// and the driver version. A file is used only after its header (magic, format, every key
// part, lengths, checksum) and its full key text have been checked, so a corrupt,
// truncated, foreign or stale file is ignored, rebuilt and replaced. Files are written to
// a unique temporary name in the same folder, synced and renamed into place, so that
// processes starting at once never see half a file. A folder that cannot be written
// leaves the cache in memory only; disk_status() says why. Nothing here reads the
// environment: the program chooses the folder.
//
// Nothing links the CUDA driver library: loading and launching go through cudart, which
// finds the driver at run time, so a program linked with this still starts on a machine
// without one.
#ifndef STEPGRAPH_DISPATCH_CUDA_NVRTC_CACHE_H_
#define STEPGRAPH_DISPATCH_CUDA_NVRTC_CACHE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/unique_handle.h"
#include "kernels/launch.h"

namespace sg {

// One program to compile. `options` are NVRTC options other than the architecture, which
// the caches add (--gpu-architecture=sm_XX).
struct KernelSource {
  std::string name;  // file name in NVRTC's messages, e.g. "sg_rmsnorm.cu"; not in the key
  std::string code;
  std::vector<std::string> options;
};

// The versions that decide whether a CUBIN on disk may be reused.
struct NvrtcToolchain {
  int nvrtc_major = 0;
  int nvrtc_minor = 0;
  int driver_version = 0;  // cudaDriverGetVersion; 0 where no driver is installed

  // NVRTC's version and the installed driver's, read once per process.
  static NvrtcToolchain Current();
};

// Compute capability of the current device as NVRTC's architecture number (90 for sm_90).
absl::StatusOr<int> CurrentDeviceArch();

// Compiles `source` for sm_<arch> (no device needed). InvalidArgument with NVRTC's log
// when the source does not compile or NVRTC cannot target `arch`.
absl::StatusOr<std::string> CompileToCubin(const KernelSource& source, int arch);
// The same program as PTX: for inspecting what the generated code became.
absl::StatusOr<std::string> CompileToPtx(const KernelSource& source, int arch);

struct CubinCacheOptions {
  // Folder of the disk cache, created if missing; empty: memory only. The program passes
  // ${XDG_CACHE_HOME:-$HOME/.cache}/stepgraph/kernels.
  std::string folder;
  // Larger files are neither read nor written.
  int64_t max_file_bytes = int64_t{64} << 20;
};

struct CubinCacheStats {
  int64_t memory_hits = 0;
  int64_t disk_hits = 0;
  int64_t compiles = 0;
  int64_t disk_writes = 0;
  // Files found at a key's path and not used (corrupt, truncated, another key or
  // toolchain, too large, not a regular file); each is rebuilt and replaced.
  int64_t disk_rejected = 0;
  std::string last_rejection;  // why the last one was not used
};

// Thread safe. Compilation happens under the cache's lock, so one process never compiles
// the same key twice.
class CubinCache {
 public:
  explicit CubinCache(CubinCacheOptions options);
  // With the versions given rather than read (tests: a stale file is one written under
  // another toolchain).
  CubinCache(CubinCacheOptions options, NvrtcToolchain toolchain);
  CubinCache(const CubinCache&) = delete;
  CubinCache& operator=(const CubinCache&) = delete;

  // The CUBIN of `source` for sm_<arch>: from memory, else from a valid file, else
  // compiled (and written to the folder when there is one). Errors are compile errors
  // only; disk trouble falls back to compiling.
  absl::StatusOr<std::shared_ptr<const std::string>> Get(const KernelSource& source, int arch);

  // OK while the folder is read and written; otherwise why the cache is memory only (no
  // folder given, the folder could not be created or written, a write failed).
  absl::Status disk_status() const;
  CubinCacheStats stats() const;
  const NvrtcToolchain& toolchain() const { return toolchain_; }
  // The file that holds (source, arch); empty without a folder. The name depends on the
  // source, options and architecture only, so a file of an older toolchain is replaced in
  // place rather than left behind.
  std::string FilePath(const KernelSource& source, int arch) const;

  // What identifies a program: options and code, length-prefixed.
  static std::string KeyText(const KernelSource& source);

 private:
  std::shared_ptr<const std::string> ReadFile(const std::string& path, const std::string& key,
                                              int arch);
  void WriteFile(const std::string& path, const std::string& key, int arch,
                 const std::string& cubin);
  void DisableDisk(absl::Status why);

  const CubinCacheOptions options_;
  const NvrtcToolchain toolchain_;
  mutable std::mutex mu_;
  bool disk_enabled_ = false;
  absl::Status disk_status_;
  CubinCacheStats stats_;
  // Key: the architecture, then the key text.
  absl::flat_hash_map<std::string, std::shared_ptr<const std::string>> memory_;
};

// The process's CubinCache for `folder` (empty: memory only), made on first use and kept
// for the life of the process, so that every dispatcher and session of the process
// shares what was compiled. Thread safe.
std::shared_ptr<CubinCache> SharedCubinCache(const std::string& folder);

// cudaLibraryUnload, but success at process exit, when the runtime may already be gone.
cudaError_t UnloadLibrary(cudaLibrary_t library);
using UniqueLibrary = UniqueHandle<cudaLibrary_t, UnloadLibrary, "cudaLibraryUnload">;

// A kernel of a loaded module, ready to launch; what a prepared node keeps. Valid while
// the CudaModuleCache that made it lives.
struct CompiledKernel {
  cudaKernel_t kernel = nullptr;
  dim3 grid;
  dim3 block;
  unsigned dynamic_shared_bytes = 0;
  // Compiled for sm_90 or later, where the generated kernels wait on griddepcontrol before
  // touching anything a previous kernel may write: they may be launched with programmatic
  // stream serialisation, as stepgraph's own kernels are (kernels/launch.h), when the
  // launch's caller allows it.
  bool programmatic_capable = false;

  // Enqueues one launch on `stream`: args[i] points at the i-th kernel argument. No
  // allocation and no synchronisation, so it may be captured into a CUDA graph. Leaves no
  // error pending.
  cudaError_t Launch(const kernels::Stream& stream, void** args) const;
};

// Loaded modules per device, over a CubinCache that may be shared between dispatchers.
// Not thread safe (one dispatcher's Prepare). Unloads its modules when destroyed.
class CudaModuleCache {
 public:
  explicit CudaModuleCache(std::shared_ptr<CubinCache> cubins);
  CudaModuleCache(const CudaModuleCache&) = delete;
  CudaModuleCache& operator=(const CudaModuleCache&) = delete;

  // `entry` (an extern "C" __global__ function of `source`) compiled for the current
  // device, with its launch shape.
  absl::StatusOr<CompiledKernel> Load(const KernelSource& source, const std::string& entry,
                                      dim3 grid, dim3 block, unsigned dynamic_shared_bytes = 0);

  CubinCache& cubins() { return *cubins_; }
  int64_t loaded_modules() const { return static_cast<int64_t>(libraries_.size()); }

 private:
  struct Device {
    int arch = 0;
  };
  std::shared_ptr<CubinCache> cubins_;
  absl::flat_hash_map<int, Device> devices_;
  // Key: the device, then the key text.
  absl::flat_hash_map<std::string, UniqueLibrary> libraries_;
};

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_CUDA_NVRTC_CACHE_H_
