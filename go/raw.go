package stepgraph

// The raw layer: one unexported Go function per C function of
// include/stepgraph/c_api/c_api.h and c_session.h, with the header's name, its parameters'
// names in its order and their types in Go (void* is unsafe.Pointer, int64_t* is *int64,
// char* is *byte, const dropped), each passing its arguments straight to the C function.
// Nothing else in the package calls C functions. cgo compiles every call against the
// header itself, so a C type that changes fails the build; what it cannot see, two
// arguments of one type swapped in a declaration here, tests/c_api/check_signatures.py
// does: it compares every function here with the header argument by argument (name and
// type, and that the call passes them in order), and the structs field by field.
//
// The libraries' folder: see link.go.

/*
#include <stdlib.h>
#include "stepgraph/c_api/c_api.h"
#include "stepgraph/c_api/c_session.h"
*/
import "C"

import "unsafe"

// sessionHandle is the opaque stepgraph_session.
type sessionHandle = C.stepgraph_session

// sessionOptions is stepgraph_session_options field for field (same names, same order, Go
// types of the same size), so that a pointer to one is a pointer to the other; the
// signature check and a test of the sizes keep it so.
type sessionOptions struct {
	struct_size int64
	max_slots   int64
	max_seq     int64
	weight_seed uint64
	backend     int32
	sampling    int32
	temperature float32
	top_k       int32
	top_p       float32
	cpu_threads int32
}

// sessionInfo is stepgraph_session_info, as sessionOptions is stepgraph_session_options.
type sessionInfo struct {
	vocab_size int64
	max_slots  int64
	max_seq    int64
	backend    int32
}

// sessionSampling is stepgraph_sampling, as sessionOptions is stepgraph_session_options.
// Its two arrays point into C memory (cAlloc): cgo refuses a Go pointer to memory that
// holds Go pointers.
type sessionSampling struct {
	struct_size        int64
	mode               int32
	temperature        float32
	top_k              int32
	top_p              float32
	repetition_penalty float32
	presence_penalty   float32
	frequency_penalty  float32
	min_p              float32
	logit_bias_count   int32
	logit_bias_ids     *int32
	logit_bias_values  *float32
}

// The C structs' sizes, for the test that compares them with the mirrors' (go vet's sizes
// of Go 1.19 leave out a struct's tail padding, so a compile-time check would fail vet).
func cStructSizes() (options, info, sampling uintptr) {
	return C.sizeof_stepgraph_session_options, C.sizeof_stepgraph_session_info,
		C.sizeof_stepgraph_sampling
}

// cAlloc is C memory of `bytes` bytes (nil when there is none), for what a struct passed
// to C points at; cFree frees it.
func cAlloc(bytes uintptr) unsafe.Pointer { return C.malloc(C.size_t(bytes)) }
func cFree(p unsafe.Pointer)              { C.free(p) }

// goString copies a NUL-terminated C string.
func goString(p *byte) string {
	return C.GoString((*C.char)(unsafe.Pointer(p)))
}

// cPointers copies a list of device pointers into C memory, for the functions that take a
// host array of them (stepgraph_clip_grad_norm): a Go array of pointers may not be passed
// to C when they point into Go memory (cgo's rules), as they do in the tests of the
// argument checks. Free the result with freeC.
func cPointers(ptrs []unsafe.Pointer) *unsafe.Pointer {
	n := len(ptrs)
	if n == 0 {
		return nil
	}
	mem := C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(unsafe.Pointer(nil))))
	if mem == nil {
		return nil
	}
	copy(unsafe.Slice((*unsafe.Pointer)(mem), n), ptrs)
	return (*unsafe.Pointer)(mem)
}

func freeC(p unsafe.Pointer) {
	C.free(p)
}

func stepgraph_abi_version() int32 {
	return int32(C.stepgraph_abi_version())
}

func stepgraph_error_string(code int32) *byte {
	return (*byte)(unsafe.Pointer(C.stepgraph_error_string(C.int32_t(code))))
}

func stepgraph_embedding(table unsafe.Pointer, ids *int32, out unsafe.Pointer, rows int64,
	vocab int64, hidden int64, dtype int32, error_flags *uint32,
	stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_embedding(table, (*C.int32_t)(unsafe.Pointer(ids)), out,
		C.int64_t(rows), C.int64_t(vocab), C.int64_t(hidden), C.int32_t(dtype),
		(*C.uint32_t)(unsafe.Pointer(error_flags)), stream))
}

func stepgraph_matmul(x unsafe.Pointer, w unsafe.Pointer, bias unsafe.Pointer, y unsafe.Pointer,
	m int64, n int64, k int64, dtype int32, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_matmul(x, w, bias, y, C.int64_t(m), C.int64_t(n), C.int64_t(k),
		C.int32_t(dtype), stream))
}

func stepgraph_rmsnorm(x unsafe.Pointer, weight unsafe.Pointer, y unsafe.Pointer, rows int64,
	hidden int64, eps float32, dtype int32, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_rmsnorm(x, weight, y, C.int64_t(rows), C.int64_t(hidden),
		C.float(eps), C.int32_t(dtype), stream))
}

func stepgraph_add(a unsafe.Pointer, b unsafe.Pointer, y unsafe.Pointer, n int64, dtype int32,
	stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_add(a, b, y, C.int64_t(n), C.int32_t(dtype), stream))
}

func stepgraph_mul(a unsafe.Pointer, b unsafe.Pointer, y unsafe.Pointer, n int64, dtype int32,
	stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_mul(a, b, y, C.int64_t(n), C.int32_t(dtype), stream))
}

func stepgraph_silu(x unsafe.Pointer, y unsafe.Pointer, n int64, dtype int32,
	stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_silu(x, y, C.int64_t(n), C.int32_t(dtype), stream))
}

func stepgraph_silu_mul(gate unsafe.Pointer, up unsafe.Pointer, y unsafe.Pointer, n int64,
	dtype int32, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_silu_mul(gate, up, y, C.int64_t(n), C.int32_t(dtype), stream))
}

func stepgraph_scale(x unsafe.Pointer, y unsafe.Pointer, n int64, alpha float32, dtype int32,
	stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_scale(x, y, C.int64_t(n), C.float(alpha), C.int32_t(dtype),
		stream))
}

func stepgraph_rope_inv_freq(head_dim int32, theta float32, scaling int32, factor float32,
	low_freq_factor float32, high_freq_factor float32, original_max_position int32,
	inv_freq *float32) int32 {
	return int32(C.stepgraph_rope_inv_freq(C.int32_t(head_dim), C.float(theta),
		C.int32_t(scaling), C.float(factor), C.float(low_freq_factor),
		C.float(high_freq_factor), C.int32_t(original_max_position),
		(*C.float)(unsafe.Pointer(inv_freq))))
}

func stepgraph_rope(x unsafe.Pointer, pos *int32, inv_freq *float32, y unsafe.Pointer,
	rows int64, cols int64, head_dim int64, interleaved int32, dtype int32,
	stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_rope(x, (*C.int32_t)(unsafe.Pointer(pos)),
		(*C.float)(unsafe.Pointer(inv_freq)), y, C.int64_t(rows), C.int64_t(cols),
		C.int64_t(head_dim), C.int32_t(interleaved), C.int32_t(dtype), stream))
}

func stepgraph_kv_write(kv unsafe.Pointer, pos *int32, cache unsafe.Pointer, rows int64,
	slots int64, kv_heads int64, seq_len int64, head_dim int64, dtype int32,
	error_flags *uint32, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_kv_write(kv, (*C.int32_t)(unsafe.Pointer(pos)), cache,
		C.int64_t(rows), C.int64_t(slots), C.int64_t(kv_heads), C.int64_t(seq_len),
		C.int64_t(head_dim), C.int32_t(dtype),
		(*C.uint32_t)(unsafe.Pointer(error_flags)), stream))
}

func stepgraph_attention_workspace_bytes(rows int64, heads int64, kv_heads int64, seq_len int64,
	head_dim int64, bytes *int64) int32 {
	return int32(C.stepgraph_attention_workspace_bytes(C.int64_t(rows), C.int64_t(heads),
		C.int64_t(kv_heads), C.int64_t(seq_len), C.int64_t(head_dim),
		(*C.int64_t)(unsafe.Pointer(bytes))))
}

func stepgraph_attention(q unsafe.Pointer, k_cache unsafe.Pointer, v_cache unsafe.Pointer,
	pos *int32, out unsafe.Pointer, rows int64, heads int64, kv_heads int64, slots int64,
	seq_len int64, head_dim int64, scale float32, dtype int32, workspace unsafe.Pointer,
	workspace_bytes int64, error_flags *uint32, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_attention(q, k_cache, v_cache,
		(*C.int32_t)(unsafe.Pointer(pos)), out, C.int64_t(rows), C.int64_t(heads),
		C.int64_t(kv_heads), C.int64_t(slots), C.int64_t(seq_len), C.int64_t(head_dim),
		C.float(scale), C.int32_t(dtype), workspace, C.int64_t(workspace_bytes),
		(*C.uint32_t)(unsafe.Pointer(error_flags)), stream))
}

func stepgraph_softmax(x unsafe.Pointer, y unsafe.Pointer, rows int64, n int64, dtype int32,
	stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_softmax(x, y, C.int64_t(rows), C.int64_t(n), C.int32_t(dtype),
		stream))
}

func stepgraph_argmax_workspace_bytes(rows int64, vocab int64, bytes *int64) int32 {
	return int32(C.stepgraph_argmax_workspace_bytes(C.int64_t(rows), C.int64_t(vocab),
		(*C.int64_t)(unsafe.Pointer(bytes))))
}

func stepgraph_argmax(logits unsafe.Pointer, ids *int32, rows int64, vocab int64, dtype int32,
	workspace unsafe.Pointer, workspace_bytes int64, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_argmax(logits, (*C.int32_t)(unsafe.Pointer(ids)),
		C.int64_t(rows), C.int64_t(vocab), C.int32_t(dtype), workspace,
		C.int64_t(workspace_bytes), stream))
}

func stepgraph_sample(logits unsafe.Pointer, seeds *int32, pos *int32, ids *int32, rows int64,
	vocab int64, temperature float32, top_k int32, top_p float32, dtype int32,
	stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_sample(logits, (*C.int32_t)(unsafe.Pointer(seeds)),
		(*C.int32_t)(unsafe.Pointer(pos)), (*C.int32_t)(unsafe.Pointer(ids)),
		C.int64_t(rows), C.int64_t(vocab), C.float(temperature), C.int32_t(top_k),
		C.float(top_p), C.int32_t(dtype), stream))
}

func stepgraph_copy(src unsafe.Pointer, dst unsafe.Pointer, n int64, dtype int32,
	stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_copy(src, dst, C.int64_t(n), C.int32_t(dtype), stream))
}

func stepgraph_advance(pos *int32, n int64, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_advance((*C.int32_t)(unsafe.Pointer(pos)), C.int64_t(n),
		stream))
}

func stepgraph_topk(x unsafe.Pointer, values unsafe.Pointer, indices *int32, rows int64,
	n int64, k int64, dtype int32, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_topk(x, values, (*C.int32_t)(unsafe.Pointer(indices)),
		C.int64_t(rows), C.int64_t(n), C.int64_t(k), C.int32_t(dtype), stream))
}

func stepgraph_flash_attention(q unsafe.Pointer, k unsafe.Pointer, v unsafe.Pointer,
	out unsafe.Pointer, batch int64, seq int64, heads int64, kv_heads int64, head_dim int64,
	scale float32, causal int32, dtype int32, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_flash_attention(q, k, v, out, C.int64_t(batch), C.int64_t(seq),
		C.int64_t(heads), C.int64_t(kv_heads), C.int64_t(head_dim), C.float(scale),
		C.int32_t(causal), C.int32_t(dtype), stream))
}

func stepgraph_gemm(a unsafe.Pointer, b unsafe.Pointer, c unsafe.Pointer, m int64, n int64,
	k int64, trans_a int32, trans_b int32, alpha float32, beta float32, dtype int32,
	workspace unsafe.Pointer, workspace_bytes int64, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_gemm(a, b, c, C.int64_t(m), C.int64_t(n), C.int64_t(k),
		C.int32_t(trans_a), C.int32_t(trans_b), C.float(alpha), C.float(beta),
		C.int32_t(dtype), workspace, C.int64_t(workspace_bytes), stream))
}

func stepgraph_gemm_batched(a unsafe.Pointer, b unsafe.Pointer, c unsafe.Pointer, batch int64,
	m int64, n int64, k int64, stride_a int64, stride_b int64, stride_c int64,
	trans_a int32, trans_b int32, alpha float32, beta float32, dtype int32,
	workspace unsafe.Pointer, workspace_bytes int64, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_gemm_batched(a, b, c, C.int64_t(batch), C.int64_t(m),
		C.int64_t(n), C.int64_t(k), C.int64_t(stride_a), C.int64_t(stride_b),
		C.int64_t(stride_c), C.int32_t(trans_a), C.int32_t(trans_b), C.float(alpha),
		C.float(beta), C.int32_t(dtype), workspace, C.int64_t(workspace_bytes), stream))
}

func stepgraph_cross_entropy(logits unsafe.Pointer, targets *int32, loss *float32,
	log_probs unsafe.Pointer, rows int64, vocab int64, ignore_index int32, dtype int32,
	error_flags *uint32, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_cross_entropy(logits, (*C.int32_t)(unsafe.Pointer(targets)),
		(*C.float)(unsafe.Pointer(loss)), log_probs, C.int64_t(rows), C.int64_t(vocab),
		C.int32_t(ignore_index), C.int32_t(dtype),
		(*C.uint32_t)(unsafe.Pointer(error_flags)), stream))
}

func stepgraph_cross_entropy_backward(logits unsafe.Pointer, targets *int32, dloss *float32,
	dlogits unsafe.Pointer, rows int64, vocab int64, ignore_index int32, dtype int32,
	error_flags *uint32, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_cross_entropy_backward(logits,
		(*C.int32_t)(unsafe.Pointer(targets)), (*C.float)(unsafe.Pointer(dloss)),
		dlogits, C.int64_t(rows), C.int64_t(vocab), C.int32_t(ignore_index),
		C.int32_t(dtype), (*C.uint32_t)(unsafe.Pointer(error_flags)), stream))
}

func stepgraph_moe_aux_loss(router_probs unsafe.Pointer, expert_ids *int32, loss *float32,
	tokens int64, experts int64, top_k int64, dtype int32, error_flags *uint32,
	stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_moe_aux_loss(router_probs,
		(*C.int32_t)(unsafe.Pointer(expert_ids)), (*C.float)(unsafe.Pointer(loss)),
		C.int64_t(tokens), C.int64_t(experts), C.int64_t(top_k), C.int32_t(dtype),
		(*C.uint32_t)(unsafe.Pointer(error_flags)), stream))
}

func stepgraph_adamw_step(param *float32, grad unsafe.Pointer, exp_avg *float32,
	exp_avg_sq *float32, n int64, lr float32, beta1 float32, beta2 float32, eps float32,
	weight_decay float32, step int64, grad_dtype int32, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_adamw_step((*C.float)(unsafe.Pointer(param)), grad,
		(*C.float)(unsafe.Pointer(exp_avg)), (*C.float)(unsafe.Pointer(exp_avg_sq)),
		C.int64_t(n), C.float(lr), C.float(beta1), C.float(beta2), C.float(eps),
		C.float(weight_decay), C.int64_t(step), C.int32_t(grad_dtype), stream))
}

func stepgraph_clip_grad_norm(grads *unsafe.Pointer, sizes *int64, count int64,
	max_norm float32, dtype int32, total_norm *float32, stream unsafe.Pointer) int32 {
	return int32(C.stepgraph_clip_grad_norm(grads, (*C.int64_t)(unsafe.Pointer(sizes)),
		C.int64_t(count), C.float(max_norm), C.int32_t(dtype),
		(*C.float)(unsafe.Pointer(total_norm)), stream))
}

func stepgraph_session_abi_version() int32 {
	return int32(C.stepgraph_session_abi_version())
}

func stepgraph_session_options_init(options *sessionOptions) int32 {
	return int32(C.stepgraph_session_options_init(
		(*C.stepgraph_session_options)(unsafe.Pointer(options))))
}

func stepgraph_sampling_init(sampling *sessionSampling) int32 {
	return int32(C.stepgraph_sampling_init((*C.stepgraph_sampling)(unsafe.Pointer(sampling))))
}

func stepgraph_session_create(model_path *byte, options *sessionOptions,
	session **sessionHandle) int32 {
	return int32(C.stepgraph_session_create((*C.char)(unsafe.Pointer(model_path)),
		(*C.stepgraph_session_options)(unsafe.Pointer(options)), session))
}

func stepgraph_session_destroy(session *sessionHandle) {
	C.stepgraph_session_destroy(session)
}

func stepgraph_session_error(session *sessionHandle) *byte {
	return (*byte)(unsafe.Pointer(C.stepgraph_session_error(session)))
}

func stepgraph_session_get_info(session *sessionHandle, info *sessionInfo) int32 {
	return int32(C.stepgraph_session_get_info(session,
		(*C.stepgraph_session_info)(unsafe.Pointer(info))))
}

func stepgraph_session_prefill(session *sessionHandle, slot int64, ids *int32, n int64,
	seed int32) int32 {
	return int32(C.stepgraph_session_prefill(session, C.int64_t(slot),
		(*C.int32_t)(unsafe.Pointer(ids)), C.int64_t(n), C.int32_t(seed)))
}

func stepgraph_session_prefill_sampled(session *sessionHandle, slot int64, ids *int32, n int64,
	seed int32, sampling *sessionSampling) int32 {
	return int32(C.stepgraph_session_prefill_sampled(session, C.int64_t(slot),
		(*C.int32_t)(unsafe.Pointer(ids)), C.int64_t(n), C.int32_t(seed),
		(*C.stepgraph_sampling)(unsafe.Pointer(sampling))))
}

func stepgraph_session_generate(session *sessionHandle, slot int64, n int64, ids *int32) int32 {
	return int32(C.stepgraph_session_generate(session, C.int64_t(slot), C.int64_t(n),
		(*C.int32_t)(unsafe.Pointer(ids))))
}

func stepgraph_session_logits(session *sessionHandle, slot int64, logits *float32,
	capacity int64) int32 {
	return int32(C.stepgraph_session_logits(session, C.int64_t(slot),
		(*C.float)(unsafe.Pointer(logits)), C.int64_t(capacity)))
}

func stepgraph_session_release(session *sessionHandle, slot int64) int32 {
	return int32(C.stepgraph_session_release(session, C.int64_t(slot)))
}

func stepgraph_session_encode(session *sessionHandle, text *byte, text_bytes int64,
	flags uint32, ids *int32, capacity int64, count *int64) int32 {
	return int32(C.stepgraph_session_encode(session, (*C.char)(unsafe.Pointer(text)),
		C.int64_t(text_bytes), C.uint32_t(flags), (*C.int32_t)(unsafe.Pointer(ids)),
		C.int64_t(capacity), (*C.int64_t)(unsafe.Pointer(count))))
}

func stepgraph_session_encode_chat(session *sessionHandle, messages_json *byte,
	json_bytes int64, ids *int32, capacity int64, count *int64) int32 {
	return int32(C.stepgraph_session_encode_chat(session,
		(*C.char)(unsafe.Pointer(messages_json)), C.int64_t(json_bytes),
		(*C.int32_t)(unsafe.Pointer(ids)), C.int64_t(capacity),
		(*C.int64_t)(unsafe.Pointer(count))))
}

func stepgraph_session_decode(session *sessionHandle, ids *int32, n int64, flags uint32,
	text *byte, capacity int64, length *int64) int32 {
	return int32(C.stepgraph_session_decode(session, (*C.int32_t)(unsafe.Pointer(ids)),
		C.int64_t(n), C.uint32_t(flags), (*C.char)(unsafe.Pointer(text)),
		C.int64_t(capacity), (*C.int64_t)(unsafe.Pointer(length))))
}

func stepgraph_session_stop_ids(session *sessionHandle, flags uint32, ids *int32,
	capacity int64, count *int64) int32 {
	return int32(C.stepgraph_session_stop_ids(session, C.uint32_t(flags),
		(*C.int32_t)(unsafe.Pointer(ids)), C.int64_t(capacity),
		(*C.int64_t)(unsafe.Pointer(count))))
}
