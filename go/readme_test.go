// The README's "From Go" section, run as it is written: its go mod lines make a module in a
// folder outside the repository that depends on this package by path, its program is that
// module's main.go, and the program, built by the go command, runs with no environment
// beyond PATH and HOME (no LD_LIBRARY_PATH, no STEPGRAPH_LIB_DIR): the rpath finds the
// libraries. (Its cmake lines, which build the libraries in the checkout, are what
// tools/test.sh's builds do.)
package stepgraph_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"stepgraph.dev/stepgraph"
)

// readmeBlocks are the fenced blocks of a language in the README's section.
func readmeBlocks(t *testing.T, section, lang string) []string {
	t.Helper()
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, "\n## "+section+"\n")
	if start < 0 {
		t.Fatalf("the README has no section %q", section)
	}
	text = text[start+1:]
	if end := strings.Index(text[3:], "\n## "); end >= 0 {
		text = text[:end+3]
	}
	var blocks []string
	for _, part := range strings.Split(text, "```"+lang+"\n")[1:] {
		blocks = append(blocks, part[:strings.Index(part, "```")])
	}
	return blocks
}

func goTool(t *testing.T) string {
	t.Helper()
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	p, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the README's program with")
	}
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// toolEnv is the environment of the go command: this one's (CGO_LDFLAGS names the
// libraries' folder where it is not a build folder of the repository) without a preloaded
// sanitizer runtime, offline, outside any workspace.
func toolEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LD_PRELOAD=") {
			env = append(env, kv)
		}
	}
	return append(env, "GOPROXY=off", "GOWORK=off", "GOFLAGS=-mod=mod")
}

// bareEnv is the program's: PATH and HOME, and the sanitizer's settings when this test runs
// under one (the library then needs its runtime first).
func bareEnv() []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for _, k := range []string{"LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

func TestReadmeProgramRunsFromAnotherFolder(t *testing.T) {
	// The block that makes the module (the other builds the libraries in the checkout).
	var module []string
	for _, block := range readmeBlocks(t, "From Go", "sh") {
		if strings.Contains(block, "go mod init") {
			module = append(module, block)
		}
	}
	program := readmeBlocks(t, "From Go", "go")
	if len(module) != 1 || len(program) != 1 {
		t.Fatalf("%d go mod and %d go blocks in the README's From Go", len(module),
			len(program))
	}
	pkg, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	goCmd := goTool(t)
	script := strings.ReplaceAll(module[0], "/path/to/stepgraph/go", pkg)
	sh := exec.Command("sh", "-e", "-c", script)
	sh.Dir = dir
	sh.Env = append(toolEnv(), "PATH="+filepath.Dir(goCmd)+":"+os.Getenv("PATH"))
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("%s\n%s", script, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(program[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	build := exec.Command(goCmd, "build", "-o", "hello", ".")
	build.Dir = dir
	build.Env = toolEnv()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	run := func(arg string) (string, error) {
		cmd := exec.Command(filepath.Join(dir, "hello"), arg)
		cmd.Dir = dir
		cmd.Env = bareEnv()
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// Without a model it still loads the libraries and says what is missing.
	out, err := run("/nonexistent/model.gguf")
	if err == nil || !strings.Contains(out, "/nonexistent/model.gguf") ||
		!strings.Contains(out, "stepgraph_session_create") {
		t.Fatalf("with a missing model: %v\n%s", err, out)
	}
	model := stepgraph.SmolLM2Path()
	if model == "" {
		t.Skip("SmolLM2-135M-Instruct.Q4_1.gguf is absent: run tests/fixtures/fetch_smollm2.sh")
	}
	if stepgraph.Sanitized() {
		t.Skip("the model's run takes minutes under the sanitizers")
	}
	if out, err := run(model); err != nil || out != "The capital of France is Paris.\n" {
		t.Fatalf("%v\n%s", err, out)
	}
}

// go/example builds and runs with nothing but PATH and HOME, and prints the ids this
// process gets from the same session.
func TestExampleBuildsAndRuns(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "example")
	build := exec.Command(goTool(t), "build", "-o", bin, "./example")
	build.Env = toolEnv()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = bareEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	s, err := stepgraph.OpenBuiltin(&stepgraph.Options{Backend: stepgraph.BackendCPU,
		MaxSeq: 96})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Prefill(0, []int32{1, 2, 3}, 0); err != nil {
		t.Fatal(err)
	}
	ids, err := s.Generate(0, 8)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintln(ids); string(out) != want {
		t.Fatalf("example printed %q, want %q", out, want)
	}
}
