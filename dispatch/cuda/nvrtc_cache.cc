#include "dispatch/cuda/nvrtc_cache.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <nvrtc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/nvrtc_headers.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

// ---- NVRTC -----------------------------------------------------------------------------

absl::Status NvrtcStatus(nvrtcResult r, absl::string_view what) {
  if (ABSL_PREDICT_TRUE(r == NVRTC_SUCCESS)) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", nvrtcGetErrorString(r));
  switch (r) {
    case NVRTC_ERROR_OUT_OF_MEMORY:
      return absl::ResourceExhaustedError(msg);
    case NVRTC_ERROR_INVALID_INPUT:
    case NVRTC_ERROR_INVALID_OPTION:
    case NVRTC_ERROR_COMPILATION:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

nvrtcResult DestroyProgram(nvrtcProgram p) { return nvrtcDestroyProgram(&p); }
using UniqueProgram = UniqueHandle<nvrtcProgram, DestroyProgram, "nvrtcDestroyProgram">;

// NVRTC dlopens libnvrtc-builtins.so.<major>.<minor> by bare name, which the dynamic loader
// looks for in the default paths and the loader cache, not next to libnvrtc and not in the
// executable's RUNPATH: a toolkit outside the loader's paths (CI, a user's install) fails
// with "failed to open libnvrtc-builtins". Loading it once by its full path beside the
// libnvrtc in use makes NVRTC's own dlopen find it already loaded (by its soname).
void LoadNvrtcBuiltins() {
  static const bool done = [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) == 0 || info.dli_fname == nullptr) {
      return false;
    }
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return false;
    const std::string self = info.dli_fname;
    const size_t slash = self.rfind('/');
    if (slash == std::string::npos) return false;
    const std::string builtins =
        absl::StrCat(self.substr(0, slash + 1), "libnvrtc-builtins.so.", major, ".", minor);
    // Never closed: NVRTC keeps using it. A failure is left to NVRTC to report.
    return dlopen(builtins.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr;
  }();
  (void)done;
}

absl::Status CheckArchSupported(int arch) {
  int count = 0;
  SG_RETURN_IF_ERROR(NvrtcStatus(nvrtcGetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs"));
  std::vector<int> archs(static_cast<size_t>(std::max(count, 0)));
  SG_RETURN_IF_ERROR(NvrtcStatus(nvrtcGetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs"));
  if (std::find(archs.begin(), archs.end(), arch) != archs.end()) return absl::OkStatus();
  const NvrtcToolchain t = NvrtcToolchain::Current();
  return absl::InvalidArgumentError(absl::StrCat(
      "NVRTC ", t.nvrtc_major, ".", t.nvrtc_minor, " cannot compile for sm_", arch,
      archs.empty() ? std::string()
                    : absl::StrCat(" (it supports sm_", archs.front(), " to sm_", archs.back(), ")")));
}

enum class Output { kCubin, kPtx };

absl::StatusOr<std::string> Compile(const KernelSource& source, int arch, Output output) {
  LoadNvrtcBuiltins();
  SG_RETURN_IF_ERROR(CheckArchSupported(arch));
  const std::string what = absl::StrCat("compiling ", source.name, " for sm_", arch);
  // Every program may include the embedded headers (nvrtc_headers.h); NVRTC reads only
  // those it includes.
  const absl::Span<const internal::NvrtcHeader> headers = internal::NvrtcHeaders();
  std::vector<const char*> header_texts, header_names;
  for (const internal::NvrtcHeader& h : headers) {
    header_texts.push_back(h.text.data());
    header_names.push_back(h.include_name);
  }
  nvrtcProgram raw = nullptr;
  SG_RETURN_IF_ERROR(NvrtcStatus(
      nvrtcCreateProgram(&raw, source.code.c_str(), source.name.c_str(),
                         static_cast<int>(headers.size()), header_texts.data(),
                         header_names.data()),
      absl::StrCat(what, ": nvrtcCreateProgram")));
  UniqueProgram program(raw);

  std::vector<std::string> options;
  options.reserve(source.options.size() + 1);
  options.push_back(output == Output::kCubin ? absl::StrCat("--gpu-architecture=sm_", arch)
                                             : absl::StrCat("--gpu-architecture=compute_", arch));
  for (const std::string& o : source.options) options.push_back(o);
  std::vector<const char*> argv;
  argv.reserve(options.size());
  for (const std::string& o : options) argv.push_back(o.c_str());

  const nvrtcResult compiled =
      nvrtcCompileProgram(program.get(), static_cast<int>(argv.size()), argv.data());
  if (compiled != NVRTC_SUCCESS) {
    size_t log_size = 0;
    std::string log;
    if (nvrtcGetProgramLogSize(program.get(), &log_size) == NVRTC_SUCCESS && log_size > 1) {
      log.resize(log_size);
      if (nvrtcGetProgramLog(program.get(), log.data()) != NVRTC_SUCCESS) log.clear();
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
      constexpr size_t kMaxLog = 4096;
      if (log.size() > kMaxLog) log = absl::StrCat(log.substr(0, kMaxLog), "\n[...]");
    }
    SG_RETURN_IF_ERROR(NvrtcStatus(compiled, absl::StrCat(what, ":\n", log)));
  }

  size_t size = 0;
  std::string result;
  if (output == Output::kCubin) {
    SG_RETURN_IF_ERROR(NvrtcStatus(nvrtcGetCUBINSize(program.get(), &size), "nvrtcGetCUBINSize"));
    result.resize(size);
    SG_RETURN_IF_ERROR(NvrtcStatus(nvrtcGetCUBIN(program.get(), result.data()), "nvrtcGetCUBIN"));
  } else {
    SG_RETURN_IF_ERROR(NvrtcStatus(nvrtcGetPTXSize(program.get(), &size), "nvrtcGetPTXSize"));
    result.resize(size);
    SG_RETURN_IF_ERROR(NvrtcStatus(nvrtcGetPTX(program.get(), result.data()), "nvrtcGetPTX"));
    while (!result.empty() && result.back() == '\0') result.pop_back();
  }
  if (result.empty()) return absl::InternalError(absl::StrCat(what, ": NVRTC returned nothing"));
  return result;
}

// ---- The file format ---------------------------------------------------------------------
//
//   0  magic "SGCUBIN1" (the last byte is the format version)
//   8  u32 header bytes (64)      12 u32 architecture
//  16  i32 NVRTC major            20 i32 NVRTC minor
//  24  i32 driver version         28 u32 zero
//  32  u64 key bytes              40 u64 payload bytes
//  48  u64 checksum of the whole file with these 8 bytes zero
//  56  u64 zero
//  64  key text, then the CUBIN
// Little-endian.

constexpr char kMagic[8] = {'S', 'G', 'C', 'U', 'B', 'I', 'N', '1'};
constexpr size_t kHeaderBytes = 64;
constexpr size_t kChecksumOffset = 48;

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

uint64_t Mix(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  return x;
}

// A 64-bit hash over words. Every step is a bijection of the state for a fixed word, so a
// change confined to one word (any burst of up to 64 bits) always changes the result.
uint64_t Hash64(absl::string_view s, uint64_t seed) {
  uint64_t h = seed ^ (s.size() * kGolden);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ Mix(w + kGolden));
    h = ((h << 27) | (h >> 37)) * 0xbf58476d1ce4e5b9ull + kGolden;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h ^= Mix(tail + (s.size() - i));
  return Mix(h + kGolden);
}

void PutU32(std::string& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void PutU64(std::string& b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t GetU32(absl::string_view b, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(b[at + i])) << (8 * i);
  return v;
}
uint64_t GetU64(absl::string_view b, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(b[at + i])) << (8 * i);
  return v;
}

uint64_t FileChecksum(std::string& file) {
  PutU64(file, kChecksumOffset, 0);
  return Hash64(file, 0x5347u);
}

std::string Errno(int e) { return std::error_code(e, std::generic_category()).message(); }

// Writes all of `data` to `fd`.
bool WriteAll(int fd, absl::string_view data, int* error) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      *error = errno;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Makes `folder` (and its parents) and proves it writable by creating and removing a
// temporary file, which also holds for root on a read-only file system.
absl::Status PrepareFolder(const std::string& folder) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("kernel cache folder ", folder, " could not be created: ", ec.message()));
  }
  if (!std::filesystem::is_directory(folder, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("kernel cache folder ", folder, " is not a directory"));
  }
  std::string probe = absl::StrCat(folder, "/.probe-XXXXXX");
  const int fd = mkstemp(probe.data());
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("kernel cache folder ", folder, " is not writable: ", Errno(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

}  // namespace

NvrtcToolchain NvrtcToolchain::Current() {
  static const NvrtcToolchain current = [] {
    NvrtcToolchain t;
    if (nvrtcVersion(&t.nvrtc_major, &t.nvrtc_minor) != NVRTC_SUCCESS) {
      t.nvrtc_major = t.nvrtc_minor = 0;
    }
    // cudart answers 0 (and success) when no driver is installed; an error counts as 0 too.
    if (cudaDriverGetVersion(&t.driver_version) != cudaSuccess) {
      (void)cudaGetLastError();
      t.driver_version = 0;
    }
    return t;
  }();
  return current;
}

absl::StatusOr<int> CurrentDeviceArch() {
  int device = 0, major = 0, minor = 0;
  SG_RETURN_IF_ERROR(ToStatus(cudaGetDevice(&device), "cudaGetDevice"));
  SG_RETURN_IF_ERROR(ToStatus(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
      "cudaDeviceGetAttribute(compute capability major)"));
  SG_RETURN_IF_ERROR(ToStatus(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
      "cudaDeviceGetAttribute(compute capability minor)"));
  return major * 10 + minor;
}

absl::StatusOr<std::string> CompileToCubin(const KernelSource& source, int arch) {
  try {
    return Compile(source, arch, Output::kCubin);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory compiling ", source.name));
  }
}

absl::StatusOr<std::string> CompileToPtx(const KernelSource& source, int arch) {
  try {
    return Compile(source, arch, Output::kPtx);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory compiling ", source.name));
  }
}

// ---- CubinCache -------------------------------------------------------------------------

CubinCache::CubinCache(CubinCacheOptions options)
    : CubinCache(std::move(options), NvrtcToolchain::Current()) {}

CubinCache::CubinCache(CubinCacheOptions options, NvrtcToolchain toolchain)
    : options_(std::move(options)), toolchain_(toolchain) {
  if (options_.folder.empty()) {
    disk_status_ = absl::FailedPreconditionError("no kernel cache folder given: memory only");
    return;
  }
  disk_status_ = PrepareFolder(options_.folder);
  disk_enabled_ = disk_status_.ok();
}

std::string CubinCache::KeyText(const KernelSource& source) {
  std::string key = absl::StrCat("stepgraph kernel\nheaders ", internal::NvrtcHeadersDigest(),
                                 "\noptions ", source.options.size(), "\n");
  for (const std::string& o : source.options) absl::StrAppend(&key, o.size(), ":", o, "\n");
  absl::StrAppend(&key, "code ", source.code.size(), ":", source.code);
  return key;
}

std::string CubinCache::FilePath(const KernelSource& source, int arch) const {
  if (options_.folder.empty()) return std::string();
  const uint64_t h = Hash64(KeyText(source), static_cast<uint64_t>(arch));
  return absl::StrFormat("%s/sm%d-%016x.sgkernel", options_.folder, arch, h);
}

absl::Status CubinCache::disk_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return disk_status_;
}

CubinCacheStats CubinCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CubinCache::DisableDisk(absl::Status why) {
  disk_enabled_ = false;
  disk_status_ = std::move(why);
}

absl::StatusOr<std::shared_ptr<const std::string>> CubinCache::Get(const KernelSource& source,
                                                                   int arch) {
  try {
    const std::string key = KeyText(source);
    const std::string memory_key = absl::StrCat(arch, ":", key);
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = memory_.find(memory_key); it != memory_.end()) {
      ++stats_.memory_hits;
      return it->second;
    }
    const std::string path = disk_enabled_ ? FilePath(source, arch) : std::string();
    std::shared_ptr<const std::string> cubin;
    if (!path.empty()) cubin = ReadFile(path, key, arch);
    if (cubin != nullptr) {
      ++stats_.disk_hits;
    } else {
      SG_ASSIGN_OR_RETURN(std::string compiled, Compile(source, arch, Output::kCubin));
      ++stats_.compiles;
      cubin = std::make_shared<const std::string>(std::move(compiled));
      if (!path.empty()) WriteFile(path, key, arch, *cubin);
    }
    memory_.emplace(memory_key, cubin);
    return cubin;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory compiling or caching ", source.name));
  }
}

std::shared_ptr<const std::string> CubinCache::ReadFile(const std::string& path,
                                                        const std::string& key, int arch) {
  auto reject = [&](std::string why) -> std::shared_ptr<const std::string> {
    ++stats_.disk_rejected;
    stats_.last_rejection = absl::StrCat(path, ": ", why);
    return nullptr;
  };
  // O_NOFOLLOW: a link is not ours; O_NONBLOCK: a FIFO planted here must not hang us.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return nullptr;  // a plain miss
    return reject(absl::StrCat("cannot be opened: ", Errno(errno)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0) return reject(absl::StrCat("fstat failed: ", Errno(errno)));
  if (!S_ISREG(st.st_mode)) return reject("not a regular file");
  if (st.st_size < static_cast<off_t>(kHeaderBytes)) return reject("truncated: shorter than its header");
  if (st.st_size > options_.max_file_bytes) {
    return reject(absl::StrCat("larger than the ", options_.max_file_bytes, "-byte limit"));
  }
  std::string file(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < file.size()) {
    const ssize_t n = ::read(fd, file.data() + got, file.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return reject(absl::StrCat("read failed: ", Errno(errno)));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != file.size()) return reject("shrank while being read");

  if (std::memcmp(file.data(), kMagic, sizeof(kMagic)) != 0) {
    return reject("not a stepgraph kernel file of this format (magic)");
  }
  if (GetU32(file, 8) != kHeaderBytes) return reject("unexpected header size");
  const uint64_t key_bytes = GetU64(file, 32);
  const uint64_t payload_bytes = GetU64(file, 40);
  const uint64_t limit = static_cast<uint64_t>(options_.max_file_bytes);
  if (key_bytes > limit || payload_bytes > limit ||
      kHeaderBytes + key_bytes + payload_bytes != file.size()) {
    return reject(absl::StrCat("truncated or padded: the header describes ",
                               kHeaderBytes + std::min(key_bytes, limit) + std::min(payload_bytes, limit),
                               " bytes, the file has ", file.size()));
  }
  if (payload_bytes == 0) return reject("empty payload");
  const uint64_t stored = GetU64(file, kChecksumOffset);
  if (FileChecksum(file) != stored) return reject("checksum mismatch (corrupt)");
  const int nvrtc_major = static_cast<int32_t>(GetU32(file, 16));
  const int nvrtc_minor = static_cast<int32_t>(GetU32(file, 20));
  const int driver = static_cast<int32_t>(GetU32(file, 24));
  if (static_cast<int>(GetU32(file, 12)) != arch) return reject("compiled for another architecture");
  if (nvrtc_major != toolchain_.nvrtc_major || nvrtc_minor != toolchain_.nvrtc_minor ||
      driver != toolchain_.driver_version) {
    return reject(absl::StrCat("stale: written by NVRTC ", nvrtc_major, ".", nvrtc_minor,
                               " with driver ", driver, ", this is NVRTC ", toolchain_.nvrtc_major,
                               ".", toolchain_.nvrtc_minor, " with driver ",
                               toolchain_.driver_version));
  }
  if (absl::string_view(file).substr(kHeaderBytes, key_bytes) != key) {
    return reject("holds another program (its name's hash collides with this one's)");
  }
  return std::make_shared<const std::string>(file.substr(kHeaderBytes + key_bytes));
}

void CubinCache::WriteFile(const std::string& path, const std::string& key, int arch,
                           const std::string& cubin) {
  const size_t total = kHeaderBytes + key.size() + cubin.size();
  if (total > static_cast<uint64_t>(options_.max_file_bytes)) return;  // kept in memory only
  std::string file(kHeaderBytes, '\0');
  std::memcpy(file.data(), kMagic, sizeof(kMagic));
  PutU32(file, 8, kHeaderBytes);
  PutU32(file, 12, static_cast<uint32_t>(arch));
  PutU32(file, 16, static_cast<uint32_t>(toolchain_.nvrtc_major));
  PutU32(file, 20, static_cast<uint32_t>(toolchain_.nvrtc_minor));
  PutU32(file, 24, static_cast<uint32_t>(toolchain_.driver_version));
  PutU64(file, 32, key.size());
  PutU64(file, 40, cubin.size());
  file.reserve(total);
  file += key;
  file += cubin;
  PutU64(file, kChecksumOffset, FileChecksum(file));

  // A unique name in the same folder, so the rename is atomic: a reader sees the old file,
  // no file, or the whole new one, and concurrent writers of one key each rename a whole
  // file.
  const size_t slash = path.rfind('/');
  std::string temp = absl::StrCat(path.substr(0, slash + 1), ".tmp-", path.substr(slash + 1), "-XXXXXX");
  const int fd = mkstemp(temp.data());
  if (fd < 0) {
    DisableDisk(absl::FailedPreconditionError(absl::StrCat(
        "kernel cache folder ", options_.folder, " became unwritable: ", Errno(errno))));
    return;
  }
  int error = 0;
  bool ok = WriteAll(fd, file, &error);
  if (ok && ::fsync(fd) != 0) {
    ok = false;
    error = errno;
  }
  if (::close(fd) != 0 && ok) {
    ok = false;
    error = errno;
  }
  if (ok && ::rename(temp.c_str(), path.c_str()) != 0) {
    ok = false;
    error = errno;
  }
  if (!ok) {
    ::unlink(temp.c_str());
    DisableDisk(absl::FailedPreconditionError(
        absl::StrCat("writing kernel cache file ", path, " failed: ", Errno(error))));
    return;
  }
  // The rename itself survives a crash only once the folder is synced.
  if (const int dir = ::open(options_.folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
  ++stats_.disk_writes;
}

// ---- Loaded modules ---------------------------------------------------------------------

cudaError_t UnloadLibrary(cudaLibrary_t library) {
  const cudaError_t e = cudaLibraryUnload(library);
  // At process exit the runtime may already be gone; the driver frees the module then.
  return e == cudaErrorCudartUnloading ? cudaSuccess : e;
}

cudaError_t CompiledKernel::Launch(const kernels::Stream& stream, void** args) const {
  cudaLaunchAttribute attribute[1];
  const cudaLaunchConfig_t config = kernels::MakeLaunchConfig(
      grid, block, dynamic_shared_bytes, stream, programmatic_capable, attribute);
  // The runtime takes a cudaKernel_t wherever it takes a kernel's address.
  const cudaError_t e = cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(kernel), args);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

std::shared_ptr<CubinCache> SharedCubinCache(const std::string& folder) {
  static std::mutex* mu = new std::mutex;
  // Never destroyed: caches may be reached from destructors of other statics at exit.
  static auto* caches = new absl::flat_hash_map<std::string, std::shared_ptr<CubinCache>>;
  std::lock_guard<std::mutex> lock(*mu);
  std::shared_ptr<CubinCache>& cache = (*caches)[folder];
  if (cache == nullptr) cache = std::make_shared<CubinCache>(CubinCacheOptions{.folder = folder});
  return cache;
}

CudaModuleCache::CudaModuleCache(std::shared_ptr<CubinCache> cubins) : cubins_(std::move(cubins)) {}

absl::StatusOr<CompiledKernel> CudaModuleCache::Load(const KernelSource& source,
                                                     const std::string& entry, dim3 grid,
                                                     dim3 block, unsigned dynamic_shared_bytes) {
  try {
    int device = 0;
    SG_RETURN_IF_ERROR(ToStatus(cudaGetDevice(&device), "cudaGetDevice"));
    auto [it, inserted] = devices_.try_emplace(device);
    if (inserted) {
      absl::StatusOr<int> arch = CurrentDeviceArch();
      if (!arch.ok()) {
        devices_.erase(it);
        return arch.status();
      }
      it->second.arch = *arch;
    }
    const Device& d = it->second;

    const std::string key = absl::StrCat(device, ":", CubinCache::KeyText(source));
    auto lib = libraries_.find(key);
    if (lib == libraries_.end()) {
      SG_ASSIGN_OR_RETURN(std::shared_ptr<const std::string> cubin, cubins_->Get(source, d.arch));
      cudaLibrary_t raw = nullptr;
      SG_RETURN_IF_ERROR(ToStatus(
          cudaLibraryLoadData(&raw, cubin->data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
          absl::StrCat("cudaLibraryLoadData(", source.name, ")")));
      lib = libraries_.emplace(key, UniqueLibrary(raw)).first;
    }
    CompiledKernel k;
    SG_RETURN_IF_ERROR(ToStatus(cudaLibraryGetKernel(&k.kernel, lib->second.get(), entry.c_str()),
                                absl::StrCat("cudaLibraryGetKernel(", source.name, ", ", entry, ")")));
    // Resolving the function in the current context loads the module now (lazy loading
    // would otherwise do it at the first launch, which may be inside a stream capture),
    // and tells how many threads the compiled kernel can take.
    cudaFuncAttributes attributes{};
    SG_RETURN_IF_ERROR(
        ToStatus(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(k.kernel)),
                 absl::StrCat("cudaFuncGetAttributes(", source.name, ", ", entry, ")")));
    const int64_t threads = int64_t{block.x} * block.y * block.z;
    if (threads <= 0 || threads > attributes.maxThreadsPerBlock) {
      return absl::InvalidArgumentError(
          absl::StrCat(entry, " of ", source.name, " takes at most ",
                       attributes.maxThreadsPerBlock, " threads per block, not ", threads));
    }
    k.grid = grid;
    k.block = block;
    k.dynamic_shared_bytes = dynamic_shared_bytes;
    k.programmatic_capable = d.arch >= 90;
    return k;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory loading ", source.name));
  }
}

}  // namespace sg
