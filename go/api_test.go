// The package's own pieces: return codes as errors, the ABI versions and the structs of the
// headers, the libraries' folder, and the half-precision conversions.
package stepgraph

import (
	"errors"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"
)

func TestVersionsAreTheHeaders(t *testing.T) {
	k, s := ABIVersions()
	if k != KernelABIVersion || s != SessionABIVersion {
		t.Fatalf("loaded ABI versions %d, %d; the headers say %d, %d", k, s, KernelABIVersion,
			SessionABIVersion)
	}
}

// The mirrors of the C structs (raw.go) have their sizes; the signature check compares
// their fields.
func TestStructMirrorsHaveTheCSizes(t *testing.T) {
	options, info, sampling := cStructSizes()
	if unsafe.Sizeof(sessionOptions{}) != options || unsafe.Sizeof(sessionInfo{}) != info ||
		unsafe.Sizeof(sessionSampling{}) != sampling {
		t.Fatalf("Go %d, %d, %d bytes; C %d, %d, %d", unsafe.Sizeof(sessionOptions{}),
			unsafe.Sizeof(sessionInfo{}), unsafe.Sizeof(sessionSampling{}), options, info,
			sampling)
	}
}

func TestCodesAreErrors(t *testing.T) {
	sentinels := map[int32]error{-1: ErrNotAvailable, -2: ErrInvalidArgument,
		-3: ErrLaunchFailed, -4: ErrOutOfMemory, -5: ErrNoTokenizer}
	for code, sentinel := range sentinels {
		err := check(code, "stepgraph_x")
		if !errors.Is(err, sentinel) {
			t.Errorf("code %d is not %v", code, sentinel)
		}
		for other, s := range sentinels {
			if other != code && errors.Is(err, s) {
				t.Errorf("code %d is also %v", code, s)
			}
		}
		var e *Error
		if !errors.As(err, &e) || e.Code != code || e.Func != "stepgraph_x" {
			t.Errorf("code %d: %#v", code, err)
		}
	}
	if check(0, "stepgraph_x") != nil {
		t.Error("STEPGRAPH_OK is an error")
	}
	unknown := check(-77, "stepgraph_x")
	for _, s := range sentinels {
		if errors.Is(unknown, s) {
			t.Errorf("code -77 is %v", s)
		}
	}
	if ErrorString(-2) == ErrorString(-3) || !strings.Contains(ErrorString(-5), "tokenizer") {
		t.Errorf("descriptions %q %q %q", ErrorString(-2), ErrorString(-3), ErrorString(-5))
	}
	msg := (&Error{Code: -2, Func: "stepgraph_f", Message: "slot 9"}).Error()
	if !strings.Contains(msg, "stepgraph_f") || !strings.Contains(msg, "slot 9") ||
		!strings.Contains(msg, "(-2)") {
		t.Errorf("message %q", msg)
	}
}

// A STEPGRAPH_LIB_DIR that the program was not linked against (no CGO_LDFLAGS) is refused
// by name when a session opens, not silently replaced by the repository's libraries.
func TestALibraryFolderNotLinkedIsRefused(t *testing.T) {
	other := t.TempDir()
	t.Setenv("STEPGRAPH_LIB_DIR", other)
	err := CheckLibraries()
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), other) ||
		!strings.Contains(err.Error(), "CGO_LDFLAGS") {
		t.Fatalf("CheckLibraries with %s: %v", other, err)
	}
	if s, err := OpenBuiltin(nil); err == nil || !strings.Contains(err.Error(), "CGO_LDFLAGS") {
		if s != nil {
			s.Close()
		}
		t.Fatalf("OpenBuiltin with STEPGRAPH_LIB_DIR=%s: %v", other, err)
	}
	// The folder the libraries were loaded from passes.
	kernels, _ := LibraryFiles()
	t.Setenv("STEPGRAPH_LIB_DIR", filepath.Dir(kernels))
	if err := CheckLibraries(); err != nil {
		t.Fatalf("the loaded folder %s: %v", filepath.Dir(kernels), err)
	}
}

// The package runs against the libraries named by STEPGRAPH_LIB_DIR when it is set (the
// folder tools/test.sh passes through CGO_LDFLAGS), else those of a build folder of the
// repository, in link.go's order.
func TestLibrariesComeFromTheFolderAsked(t *testing.T) {
	folders := []string{"../build/cuda", "../build/nocuda", "../build"}
	if dir := os.Getenv("STEPGRAPH_LIB_DIR"); dir != "" {
		folders = []string{dir}
	}
	kernels, sessions := LibraryFiles()
	for _, loaded := range []string{kernels, sessions} {
		got, err := filepath.EvalSymlinks(loaded)
		if err != nil {
			t.Fatalf("loaded from %q: %v", loaded, err)
		}
		// The first folder that holds the file is the one the loader must have used.
		var want string
		for _, dir := range folders {
			p, err := filepath.EvalSymlinks(filepath.Join(dir, filepath.Base(loaded)))
			if err == nil {
				want = p
				break
			}
		}
		if got != want {
			t.Errorf("loaded %s, want the one of %v: %q", got, folders, want)
		}
	}
	if filepath.Base(kernels) != "libstepgraph_c.so" ||
		filepath.Base(sessions) != "libstepgraph_session_c.so" {
		t.Errorf("loaded %s and %s", kernels, sessions)
	}
}

func TestBF16RoundsToNearestEven(t *testing.T) {
	cases := []struct {
		f    float32
		bits BF16
	}{
		{1, 0x3f80}, {-2, 0xc000}, {0, 0}, {float32(math.Inf(1)), 0x7f80},
		{math.Float32frombits(0x3f808000), 0x3f80}, // a tie, to even (down)
		{math.Float32frombits(0x3f818000), 0x3f82}, // a tie, to even (up)
		{math.Float32frombits(0x3f808001), 0x3f81}, // above the tie
		{math.Float32frombits(0x7f7fffff), 0x7f80}, // the largest float rounds to Inf
	}
	for _, c := range cases {
		if got := BF16FromFloat32(c.f); got != c.bits {
			t.Errorf("BF16(%g) = %#04x, want %#04x", c.f, got, c.bits)
		}
	}
	nan := BF16FromFloat32(float32(math.NaN()))
	if v := nan.Float32(); v == v {
		t.Errorf("NaN became %g", v)
	}
	for b := 0; b < 1<<16; b++ {
		v := BF16(b).Float32()
		if v == v && BF16FromFloat32(v) != BF16(b) {
			t.Fatalf("%#04x -> %g -> %#04x", b, v, BF16FromFloat32(v))
		}
	}
}

func TestF16RoundsToNearestEven(t *testing.T) {
	cases := []struct {
		f    float32
		bits F16
	}{
		{1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {65519, 0x7bff}, {65520, 0x7c00},
		{1e6, 0x7c00}, {float32(math.Inf(-1)), 0xfc00},
		{1.0 / (1 << 14), 0x0400},         // the smallest normal
		{1.0 / (1 << 24), 0x0001},         // the smallest subnormal
		{1.0 / (1 << 25), 0x0000},         // half of it: a tie, to even (zero)
		{3.0 / (1 << 25), 0x0002},         // 1.5 units: a tie, to even (2)
		{1.0/(1<<25) + 1.0/(1<<35), 0x01}, // just above half a unit
		{1 + 1.0/(1<<11), 0x3c00},         // a tie between 1 and the next: to even
		{1 + 3.0/(1<<11), 0x3c02},
		{float32(math.Copysign(0, -1)), 0x8000},
	}
	for _, c := range cases {
		if got := F16FromFloat32(c.f); got != c.bits {
			t.Errorf("F16(%g) = %#04x, want %#04x", c.f, got, c.bits)
		}
	}
	if v := F16FromFloat32(float32(math.NaN())).Float32(); v == v {
		t.Errorf("NaN became %g", v)
	}
	for b := 0; b < 1<<16; b++ {
		v := F16(b).Float32()
		if v == v && F16FromFloat32(v) != F16(b) {
			t.Fatalf("%#04x -> %g -> %#04x", b, v, F16FromFloat32(v))
		}
	}
	// Random floats: the result is a nearest half.
	rng := rand.New(rand.NewSource(7))
	for i := 0; i < 100000; i++ {
		f := float32(rng.NormFloat64() * math.Pow(2, float64(rng.Intn(40)-25)))
		h := F16FromFloat32(f)
		got := float64(h.Float32())
		if math.IsInf(got, 0) {
			if math.Abs(float64(f)) < 65520 {
				t.Fatalf("%g became %g", f, got)
			}
			continue
		}
		for _, n := range []F16{h - 1, h + 1} {
			if n&0x7c00 == 0x7c00 || (n^h)&0x8000 != 0 {
				continue
			}
			if math.Abs(float64(n.Float32())-float64(f)) < math.Abs(got-float64(f)) {
				t.Fatalf("%g became %g, but %g is nearer", f, got, n.Float32())
			}
		}
	}
}
