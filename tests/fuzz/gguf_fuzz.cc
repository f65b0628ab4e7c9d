// libFuzzer harness: any bytes as a GGUF file. The reader must give views inside the
// input or an error; every typed read of every value must answer; and a file that parses
// goes on through the Llama model checks, the graph and the weight bindings. Never crash,
// leak or hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "models/gguf.h"
#include "models/gguf_model.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/dispatch/executor.h"

namespace {

bool Inside(const void* p, size_t n, const uint8_t* data, size_t size) {
  const auto* b = static_cast<const uint8_t*>(p);
  return n == 0 || (b >= data && b + n <= data + size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sg::GgufLimits limits;
  // Lower than the defaults so that a small input cannot ask for much either.
  limits.max_array_elements = 1 << 20;
  absl::StatusOr<sg::GgufFile> file = sg::GgufFile::Parse(
      absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(data), size), "fuzz.gguf",
      limits);
  if (!file.ok()) return 0;
  for (const sg::GgufValue& v : file->metadata()) {
    if (!Inside(v.key().data(), v.key().size(), data, size)) std::abort();
    (void)v.ToString();
    (void)v.Int();
    (void)v.Float();
    (void)v.Bool();
    if (absl::StatusOr<absl::string_view> s = v.String(); s.ok()) {
      if (!Inside(s->data(), s->size(), data, size)) std::abort();
    }
    if (auto strings = v.StringArray(); strings.ok()) {
      for (absl::string_view s : *strings) {
        if (!Inside(s.data(), s.size(), data, size)) std::abort();
      }
    }
    (void)v.IntArray();
    (void)v.FloatArray();
  }
  for (const sg::GgufTensor& t : file->tensors()) {
    if (!Inside(t.data.data(), t.data.size(), data, size)) std::abort();
    if (static_cast<int64_t>(t.data.size()) != sg::TensorBytes(t.dtype, t.shape)) std::abort();
    if (file->FindTensor(t.name) != &t) std::abort();
  }
  absl::StatusOr<sg::GgufModel> model = sg::GgufModel::FromFile(*std::move(file));
  if (!model.ok()) return 0;
  // A model that passes has every weight inside the file, so the graph it implies is
  // bounded by the input: float tensors widened to the compute dtype at load (f16 or bf16
  // to f32 where a quantized tensor makes the file compute in f32) take at most twice
  // their bytes. A short cache keeps its states small. Binding checks each weight against
  // the graph (a quantized one is refused by this f32 graph).
  if (model->weight_bytes() > 2 * static_cast<int64_t>(size)) std::abort();
  sg::LlamaGraphOptions options;
  options.max_seq = 4;
  absl::StatusOr<sg::Graph> graph = sg::BuildLlamaDecodeGraph(model->config(), options);
  if (!graph.ok()) return 0;
  sg::Bindings bindings(*graph);
  (void)sg::BindGgufWeights(*model, *graph, bindings);
  return 0;
}
