// tests/c_api/check_signatures.py compares raw.go with the headers (ctest runs it); here,
// that it agrees today and that it does catch what cgo's compilation cannot: two arguments
// of one type swapped, in a declaration or in the call, a retyped argument that converts
// silently, a reordered struct field, a C function called outside raw.go.
package stepgraph

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The check, run on raw.go and the package's other files with one replacement made.
const checkScript = `
import json, sys
sys.path.insert(0, "../tests/c_api")
import check_signatures as cs
case = json.load(sys.stdin)
functions, structs, _ = cs.read_headers("..")
raw, others = cs.read_go_package("..")
if case["file"] == "raw.go":
    assert case["old"] in raw, case["old"]
    raw = raw.replace(case["old"], case["new"], 1)
else:
    others = [(p, t.replace(case["old"], case["new"], 1) if p == case["file"] else t)
              for p, t in others]
json.dump(cs.check_go(functions, structs, raw, others), sys.stdout)
`

func signatureProblems(t *testing.T, file, old, new string) []string {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not here to run tests/c_api/check_signatures.py")
	}
	cmd := exec.Command(python, "-c", checkScript)
	in, _ := json.Marshal(map[string]string{"file": file, "old": old, "new": new})
	cmd.Stdin = strings.NewReader(string(in))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the check failed to run: %v", err)
	}
	var problems []string
	if err := json.Unmarshal(out, &problems); err != nil {
		t.Fatal(err)
	}
	return problems
}

func TestSignatureCheckCoversGo(t *testing.T) {
	if p := signatureProblems(t, "raw.go", "", ""); len(p) != 0 {
		t.Fatalf("raw.go and the headers disagree: %v", p)
	}
	for _, c := range []struct{ what, file, old, new, caught string }{
		{"a swapped declaration", "raw.go", "\tslots int64, kv_heads int64, seq_len",
			"\tkv_heads int64, slots int64, seq_len", "stepgraph_kv_write argument 4"},
		{"a swapped call", "raw.go", "C.stepgraph_add(a, b, y,", "C.stepgraph_add(b, a, y,",
			"stepgraph_add passes 'b' as C argument 0"},
		{"a retyped argument", "raw.go", "y unsafe.Pointer, rows int64,\n\thidden int64, eps",
			"y unsafe.Pointer, rows int32,\n\thidden int64, eps",
			"stepgraph_rmsnorm argument 3 (rows) is int32"},
		{"a reordered field", "raw.go", "\ttop_k       int32\n\ttop_p       float32\n",
			"\ttop_p       float32\n\ttop_k       int32\n", "struct sessionOptions"},
		{"a missing function", "raw.go", "func stepgraph_advance(", "func stepgraph_advanced(",
			"stepgraph_advance is missing"},
		{"a call outside raw.go", "go/kernels.go", "stepgraph_advance(i32Ptr(pos)",
			"C.stepgraph_advance((*C.int32_t)(i32Ptr(pos))", "calls C.stepgraph_advance"},
	} {
		problems := signatureProblems(t, c.file, c.old, c.new)
		if !strings.Contains(strings.Join(problems, "\n"), c.caught) {
			t.Errorf("%s: the check says %q, not %q", c.what, problems, c.caught)
		}
	}
}
