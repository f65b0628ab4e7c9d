// The harness of the kernel tests: inputs are random host slices; a run puts them where the
// kernels read them and compares what comes back with a reference computed here in Go, in
// float64, from c_api.h's definitions.
//
// With a device (a CUDA build on a GPU machine) the slices go to device memory (through the
// CUDA runtime, internal/cudart), outputs start poisoned, and after the call they come back
// and are compared. Without one (the CPU-only build, or no GPU) the same calls get host
// memory: the library checks the arguments as it would on a GPU (they must pass), then
// answers ErrNotAvailable, and the outputs must be as they were.
package stepgraph

import (
	"bytes"
	"errors"
	"math"
	"math/rand"
	"testing"
	"unsafe"

	"stepgraph.dev/stepgraph/internal/cudart"
)

type run struct {
	t      *testing.T
	device bool
	outs   []output
}

type output struct {
	host, dev unsafe.Pointer
	bytes     int
	before    []byte
}

func newRun(t *testing.T) *run {
	t.Helper()
	r := &run{t: t, device: DeviceAvailable()}
	if r.device {
		if err := cudart.Open(); err != nil {
			t.Fatalf("a device is there, but its memory is out of reach: %v", err)
		}
	}
	return r
}

func hostBytes[T any](s []T) (unsafe.Pointer, int) {
	if len(s) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(&s[0]), len(s) * int(unsafe.Sizeof(s[0]))
}

// in is a slice the call reads.
func in[T any](r *run, host []T) DeviceSlice[T] {
	r.t.Helper()
	p, n := hostBytes(host)
	if !r.device {
		return NewDeviceSlice[T](p, len(host))
	}
	d, err := cudart.Malloc(n)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = cudart.Free(d) })
	if err := cudart.Upload(d, p, n); err != nil {
		r.t.Fatal(err)
	}
	return NewDeviceSlice[T](d, len(host))
}

// out is a slice the call writes, or updates in place: host holds what it starts with
// (poison, or the data to update) and receives the result.
func out[T any](r *run, host []T) DeviceSlice[T] {
	r.t.Helper()
	s := in(r, host)
	p, n := hostBytes(host)
	before := append([]byte(nil), unsafe.Slice((*byte)(p), n)...)
	r.outs = append(r.outs, output{host: p, dev: s.ptr, bytes: n, before: before})
	return s
}

// flags is a zeroed error word.
func flags(r *run) (ErrorFlags, *uint32) {
	word := []uint32{0}
	return out(r, word), &word[0]
}

// done takes the call's error. With a device the call must have succeeded, and the outputs
// come back (true: compare them). Without, it must be ErrNotAvailable with every output as
// it was (false).
func (r *run) done(what string, err error) bool {
	r.t.Helper()
	outs := r.outs
	r.outs = nil
	if !r.device {
		if !errors.Is(err, ErrNotAvailable) {
			r.t.Fatalf("%s without a device: %v, want ErrNotAvailable", what, err)
		}
		for i, o := range outs {
			if !bytes.Equal(o.before, unsafe.Slice((*byte)(o.host), o.bytes)) {
				r.t.Fatalf("%s without a device wrote its output %d", what, i)
			}
		}
		return false
	}
	if err != nil {
		r.t.Fatalf("%s: %v", what, err)
	}
	if err := cudart.Synchronize(); err != nil {
		r.t.Fatalf("%s: %v", what, err)
	}
	for _, o := range outs {
		if err := cudart.Download(o.host, o.dev, o.bytes); err != nil {
			r.t.Fatal(err)
		}
	}
	return true
}

// ---- inputs and comparisons ------------------------------------------------------------

func uniform(rng *rand.Rand, n int, lo, hi float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(lo + (hi-lo)*rng.Float64())
	}
	return v
}

func poisoned(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(math.NaN())
	}
	return v
}

func poisonedIDs(n int) []int32 {
	v := make([]int32, n)
	for i := range v {
		v[i] = -7
	}
	return v
}

func f64s(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// closeTo fails unless ‖got − want‖ / ‖want‖ <= tol (a NaN anywhere fails; tol 0 asks for
// the same values).
func closeTo(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	var diff, norm float64
	for i := range got {
		d := float64(got[i]) - want[i]
		diff += d * d
		norm += want[i] * want[i]
	}
	err := math.Sqrt(diff) / math.Max(math.Sqrt(norm), 1e-30)
	if !(err <= tol) {
		t.Fatalf("%s: normalised error %g (tolerance %g)", what, err, tol)
	}
}

func equalIDs(t *testing.T, what string, got, want []int32) {
	t.Helper()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s[%d] = %d, want %d (all: %v, want %v)", what, i, got[i], want[i], got,
				want)
		}
	}
}

// toFloat and fromFloat convert between float32 and the element types.
func toFloat[T Float](v []float32) []T {
	out := make([]T, len(v))
	for i, x := range v {
		switch p := any(&out[i]).(type) {
		case *float32:
			*p = x
		case *BF16:
			*p = BF16FromFloat32(x)
		case *F16:
			*p = F16FromFloat32(x)
		}
	}
	return out
}

func fromFloat[T Float](v []T) []float32 {
	out := make([]float32, len(v))
	for i := range v {
		switch x := any(v[i]).(type) {
		case float32:
			out[i] = x
		case BF16:
			out[i] = x.Float32()
		case F16:
			out[i] = x.Float32()
		}
	}
	return out
}
