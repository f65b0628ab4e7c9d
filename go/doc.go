// Package stepgraph is stepgraph from Go: the decode sessions of
// include/stepgraph/c_api/c_session.h and the kernel library of c_api.h, through cgo over
// the libraries the repository's CMake build makes (libstepgraph_session_c.so,
// libstepgraph_c.so; go/README.md says how they are found).
//
// A Session loads a model file (a Hugging Face folder or a GGUF file) or the built-in tiny
// Llama with random weights, on the CPU reference or a GPU, and prefills, generates,
// returns logits and turns text into ids and back with the model's tokenizer:
//
//	s, err := stepgraph.OpenBuiltin(&stepgraph.Options{Backend: stepgraph.BackendCPU})
//	if err != nil { ... }
//	defer s.Close()
//	if err := s.Prefill(0, []int32{1, 2, 3}, 0); err != nil { ... }
//	ids, err := s.Generate(0, 8)
//
// A call may choose its own sampling, penalties and logit bias (SamplingOptions, through
// PrefillWith and the Generate*With calls), and the text calls' stop strings
// (SamplingOptions.Stop).
//
// The kernels (Add, RMSNorm, MatMul, Attention, Sample, Gemm, AdamWStep, ...) take device
// memory as DeviceSlice values and check their lengths against the shapes before calling.
//
// Errors are *Error values carrying the C ABI's return code, compared with errors.Is
// against ErrNotAvailable (-1: no device, or a library built without CUDA), ErrInvalidArgument
// (-2), ErrLaunchFailed (-3), ErrOutOfMemory (-4) and ErrNoTokenizer (-5).
//
// Goroutines: the kernel functions keep no state and may be called from any goroutine. A
// Session serialises its calls with a lock (its C handle is used by one thread at a time),
// so one Session may be shared, its calls then running one after another; Close waits for
// a call in progress.
//
// The layers, as stepgraph's bindings are made: raw.go holds one unexported Go function per
// C function (checked against the headers by tests/c_api/check_signatures.py); kernels.go
// and session.go are the safe API over it.
package stepgraph
