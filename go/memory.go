package stepgraph

/*
#include "stepgraph/c_api/c_api.h"
*/
import "C"

import (
	"math"
	"unsafe"
)

// The element types of the kernels and their dtype values. Float is a float dtype (math in
// f32); Element adds int32, which stepgraph_add and stepgraph_copy also take.
type (
	Float interface {
		float32 | BF16 | F16
	}
	Element interface {
		Float | int32
	}
)

// BF16 is a bfloat16's bits, F16 an IEEE half's; make them with BF16FromFloat32 and
// F16FromFloat32 (round to nearest even), read them with Float32.
type (
	BF16 uint16
	F16  uint16
)

// The dtype values of the C ABI.
const (
	DTypeF32  = C.STEPGRAPH_F32
	DTypeBF16 = C.STEPGRAPH_BF16
	DTypeF16  = C.STEPGRAPH_F16
	DTypeI32  = C.STEPGRAPH_I32
)

// DType is the dtype value of T.
func DType[T Element]() int32 {
	var zero T
	switch any(zero).(type) {
	case BF16:
		return DTypeBF16
	case F16:
		return DTypeF16
	case int32:
		return DTypeI32
	}
	return DTypeF32
}

// BF16FromFloat32 rounds f to the nearest bfloat16 (ties to even); NaN stays NaN.
func BF16FromFloat32(f float32) BF16 {
	b := math.Float32bits(f)
	if f != f {
		return BF16(b>>16 | 0x40) // quiet NaN, sign kept
	}
	return BF16((b + 0x7fff + (b >> 16 & 1)) >> 16)
}

func (b BF16) Float32() float32 {
	return math.Float32frombits(uint32(b) << 16)
}

// F16FromFloat32 rounds f to the nearest half (ties to even), to ±Inf past 65504 (as
// 65520 and more round), to subnormals and zero below 2^-14; NaN stays NaN.
func F16FromFloat32(f float32) F16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23&0xff) - 127
	mant := b & 0x7fffff
	switch {
	case exp == 128: // Inf or NaN
		if mant != 0 {
			return F16(sign | 0x7e00)
		}
		return F16(sign | 0x7c00)
	case exp > 15:
		return F16(sign | 0x7c00)
	case exp >= -14: // normal: 10 of the 23 mantissa bits, rounded; a carry may reach Inf
		h := uint32(exp+15)<<10 | mant>>13
		rest := mant & 0x1fff
		if rest > 0x1000 || rest == 0x1000 && h&1 == 1 {
			h++
		}
		return F16(uint32(sign) | h)
	case exp >= -25: // subnormal: the value in units of 2^-24, rounded
		m := mant | 0x800000      // the implicit bit: value = m · 2^(exp-23)
		shift := uint32(-exp - 1) // 2^(exp-23) / 2^-24 = 2^(exp+1)
		h := m >> shift
		rest := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rest > half || rest == half && h&1 == 1 {
			h++
		}
		return F16(uint32(sign) | h)
	}
	return F16(sign)
}

func (h F16) Float32() float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h >> 10 & 0x1f)
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	v := float32(mant) * (1.0 / (1 << 24)) // subnormal: mant · 2^-24, exact in f32
	if sign != 0 {
		v = -v
	}
	return v
}

// DeviceSlice is n elements of T in device memory (cudaMalloc or managed): what the
// kernels read and write. The package cannot see whether a pointer is device memory, or
// how long it is: NewDeviceSlice takes the caller's word for both, once, and every
// wrapper then checks the slices' lengths against the shape it is given.
type DeviceSlice[T any] struct {
	ptr unsafe.Pointer
	n   int
}

// NewDeviceSlice vouches that ptr is device memory of at least n elements of T, aligned
// for T, that stays valid while work enqueued with it runs.
func NewDeviceSlice[T any](ptr unsafe.Pointer, n int) DeviceSlice[T] {
	return DeviceSlice[T]{ptr: ptr, n: n}
}

func (s DeviceSlice[T]) Len() int                { return s.n }
func (s DeviceSlice[T]) Pointer() unsafe.Pointer { return s.ptr }

// ErrorFlags is the error word of the kernels that refuse out-of-range ids or positions:
// one device uint32 (FlagTokenOutOfRange, FlagPositionOutOfRange), never cleared by them.
type ErrorFlags = DeviceSlice[uint32]

// The bits of an ErrorFlags word.
const (
	FlagTokenOutOfRange    = C.STEPGRAPH_FLAG_TOKEN_OUT_OF_RANGE
	FlagPositionOutOfRange = C.STEPGRAPH_FLAG_POSITION_OUT_OF_RANGE
)

// Stream is a cudaStream_t of the current device; the zero Stream is the default stream.
// A kernel call only enqueues work on it.
type Stream struct {
	raw unsafe.Pointer
}

// StreamFromRaw wraps a cudaStream_t that outlives every call given it.
func StreamFromRaw(raw unsafe.Pointer) Stream { return Stream{raw: raw} }

func (s Stream) Raw() unsafe.Pointer { return s.raw }
