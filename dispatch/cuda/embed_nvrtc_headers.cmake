# Writes OUTPUT, a C++ source that holds the text of every header in LIST_FILE (lines
# "<include name>|<path>") for NVRTC (dispatch/cuda/nvrtc_headers.h), with a SHA-256 digest
# of names and texts together that the kernel cache keys include. Run at build time
# (cmake -P), so the library always carries the headers of its own tree and toolkit.
file(STRINGS "${LIST_FILE}" entries)
set(delimiter "sg_nvrtc_header")
set(body "")
set(table "")
set(all_digests "")
set(index 0)
foreach(entry IN LISTS entries)
  string(FIND "${entry}" "|" bar)
  string(SUBSTRING "${entry}" 0 ${bar} name)
  math(EXPR after "${bar} + 1")
  string(SUBSTRING "${entry}" ${after} -1 path)
  file(READ "${path}" text)
  string(FIND "${text}" ")${delimiter}\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${path} contains the raw-string delimiter ${delimiter}")
  endif()
  file(SHA256 "${path}" digest)
  string(APPEND all_digests "${name} ${digest}\n")
  string(APPEND body "constexpr char kText${index}[] = R\"${delimiter}(${text})${delimiter}\";\n")
  string(APPEND table "    {\"${name}\", {kText${index}, sizeof(kText${index}) - 1}},\n")
  math(EXPR index "${index} + 1")
endforeach()
string(SHA256 digest "${all_digests}")
set(banner "// Written by dispatch/cuda/embed_nvrtc_headers.cmake at build time; do not edit.")
file(WRITE "${OUTPUT}" "${banner}
#include \"dispatch/cuda/nvrtc_headers.h\"

namespace sg::internal {
namespace {

${body}
constexpr NvrtcHeader kHeaders[] = {
${table}};

}  // namespace

absl::Span<const NvrtcHeader> NvrtcHeaders() { return kHeaders; }

absl::string_view NvrtcHeadersDigest() { return \"${digest}\"; }

}  // namespace sg::internal
")
