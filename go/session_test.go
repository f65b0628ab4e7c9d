// Sessions of the built-in model on the CPU: ids reproducible from the weights' seed and
// equal to the argmax of the logits, sampling following the slot's seed, every refusal an
// error with the library's message, and one Session shared by goroutines.
package stepgraph

import (
	"errors"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func cpu(t *testing.T, seed uint64) *Session {
	t.Helper()
	s, err := OpenBuiltin(&Options{MaxSlots: 2, MaxSeq: 32, WeightSeed: seed,
		Backend: BackendCPU})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

func TestGreedyIDsAreTheArgmaxOfTheLogits(t *testing.T) {
	s := cpu(t, 42)
	info := s.Info()
	if info.Backend != BackendCPU || info.MaxSlots != 2 || info.MaxSeq != 32 ||
		info.VocabSize < 2 {
		t.Fatalf("info %+v", info)
	}
	prompt := []int32{5, 17, 300, 2}
	if err := s.Prefill(1, prompt, 0); err != nil {
		t.Fatal(err)
	}
	var ids []int32
	for i := 0; i < 4; i++ {
		got, err := s.Generate(1, 1)
		if err != nil {
			t.Fatal(err)
		}
		logits, err := s.Logits(1)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(logits)) != info.VocabSize || got[0] != argmax(logits) {
			t.Fatalf("step %d: id %d, argmax %d of %d logits", i, got[0], argmax(logits),
				len(logits))
		}
		ids = append(ids, got[0])
	}
	// The same weights, the same ids, in another slot and in one call; other weights,
	// other logits.
	same := cpu(t, 42)
	if err := same.Prefill(0, prompt, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := same.Generate(0, 4); err != nil || !reflect.DeepEqual(got, ids) {
		t.Fatalf("%v, %v; want %v", got, err, ids)
	}
	other := cpu(t, 43)
	if err := other.Prefill(0, prompt, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Generate(0, 4); err != nil {
		t.Fatal(err)
	}
	a, _ := same.Logits(0)
	b, _ := other.Logits(0)
	if reflect.DeepEqual(a, b) {
		t.Fatal("weights of seeds 42 and 43 give the same logits")
	}
}

func TestSamplingFollowsTheSeed(t *testing.T) {
	s, err := OpenBuiltin(&Options{MaxSeq: 32, WeightSeed: 1, Backend: BackendCPU,
		Sampling: &Sampling{Temperature: 5, TopP: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var runs [][]int32
	for _, seed := range []int32{3, 3, 4} {
		if err := s.Prefill(0, []int32{9, 8, 7}, seed); err != nil {
			t.Fatal(err)
		}
		ids, err := s.Generate(0, 12)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, ids)
	}
	if !reflect.DeepEqual(runs[0], runs[1]) || reflect.DeepEqual(runs[0], runs[2]) {
		t.Fatalf("seeds 3, 3, 4 gave %v", runs)
	}
	_, err = OpenBuiltin(&Options{Backend: BackendCPU, Sampling: &Sampling{TopP: 1}})
	isInvalid(t, "temperature 0", err, "temperature")
}

func TestSessionErrorsCarryTheLibrarysMessage(t *testing.T) {
	s := cpu(t, 1)
	vocab := int32(s.Info().VocabSize)
	isInvalid(t, "slot 2", s.Prefill(2, []int32{1, 2}, 0), "slot")
	isInvalid(t, "no ids", s.Prefill(0, nil, 0), "stepgraph_session_prefill")
	isInvalid(t, "id = vocab", s.Prefill(0, []int32{vocab}, 0), "stepgraph_session_prefill")
	_, err := s.Generate(0, 1)
	isInvalid(t, "nothing live", err, "stepgraph_session_generate")
	_, err = s.Logits(0)
	isInvalid(t, "logits before a step", err, "stepgraph_session_logits")
	if err := s.Prefill(0, []int32{1, 2}, 0); err != nil {
		t.Fatal(err)
	}
	_, err = s.Generate(0, 0)
	isInvalid(t, "0 steps", err, "stepgraph_session_generate")
	_, err = s.Generate(0, 100)
	isInvalid(t, "past max_seq", err, "stepgraph_session_generate")
	// A refusal leaves the session usable.
	if _, err := s.Generate(0, 3); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(0); err != nil {
		t.Fatal(err)
	}
	_, err = Open("/nonexistent/stepgraph-model", &Options{Backend: BackendCPU})
	isInvalid(t, "a missing model", err, "/nonexistent/stepgraph-model")
	_, err = Open("", nil)
	isInvalid(t, "an empty path", err, "OpenBuiltin")
	_, err = OpenBuiltin(&Options{Backend: Backend(7)})
	isInvalid(t, "backend 7", err, "backend")
	_, err = OpenBuiltin(&Options{MaxSeq: -1})
	isInvalid(t, "max_seq -1", err, "max_seq")
	if !DeviceAvailable() {
		_, err = OpenBuiltin(&Options{Backend: BackendCUDA})
		if !errors.Is(err, ErrNotAvailable) {
			t.Fatalf("CUDA without a device: %v", err)
		}
	}
}

func TestCloseIsFinal(t *testing.T) {
	s := cpu(t, 1)
	if err := s.Prefill(0, []int32{1, 2}, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal("a second Close:", err)
	}
	if _, err := s.Generate(0, 1); err != ErrClosed {
		t.Fatalf("Generate after Close: %v", err)
	}
	if _, err := s.Encode("x", EncodeOptions{}); err != ErrClosed {
		t.Fatalf("Encode after Close: %v", err)
	}
	if _, err := s.StopIDs(false); err != ErrClosed {
		t.Fatalf("StopIDs after Close: %v", err)
	}
}

// One Session shared by goroutines: calls are serialised, so each goroutine's slot gets
// the ids it would get alone; Close while they run is safe, and what follows it is
// ErrClosed.
func TestGoroutinesShareASession(t *testing.T) {
	const slots = 4
	s, err := OpenBuiltin(&Options{MaxSlots: slots, MaxSeq: 64, WeightSeed: 3,
		Backend: BackendCPU, CPUThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	prompt := func(slot int) []int32 { return []int32{int32(10 + slot), 4, int32(100 * slot)} }
	// Alone: each slot's first id after its prompt (a step runs every live slot, so only
	// the first step after a prefill is the slot's alone).
	want := make([]int32, slots)
	for slot := 0; slot < slots; slot++ {
		if err := s.Prefill(slot, prompt(slot), 0); err != nil {
			t.Fatal(err)
		}
		ids, err := s.Generate(slot, 1)
		if err != nil {
			t.Fatal(err)
		}
		want[slot] = ids[0]
		if err := s.Release(slot); err != nil {
			t.Fatal(err)
		}
	}
	// Together: each goroutine prefills its slot and generates, over and over. Under the
	// lock a goroutine's prefill and generate may have others' calls between them, so only
	// the shape of what comes back is known: len 1, in the vocabulary.
	var wg sync.WaitGroup
	errs := make(chan error, slots)
	for slot := 0; slot < slots; slot++ {
		wg.Add(1)
		go func(slot int) {
			defer wg.Done()
			for i := 0; i < 8; i++ {
				if err := s.Prefill(slot, prompt(slot), 0); err != nil {
					errs <- err
					return
				}
				ids, err := s.Generate(slot, 1)
				if err != nil {
					errs <- err
					return
				}
				if len(ids) != 1 || ids[0] < 0 || int64(ids[0]) >= s.Info().VocabSize {
					errs <- errors.New("a bad id")
					return
				}
			}
		}(slot)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Serialised calls are the same calls as alone: replay the alone order from
	// goroutines that take turns through a channel, and get the alone ids.
	turn := make(chan struct{}, 1)
	turn <- struct{}{}
	got := make([]int32, slots)
	for slot := 0; slot < slots; slot++ {
		wg.Add(1)
		go func(slot int) {
			defer wg.Done()
			<-turn
			defer func() { turn <- struct{}{} }()
			if err := s.Prefill(slot, prompt(slot), 0); err != nil {
				t.Error(err)
				return
			}
			ids, err := s.Generate(slot, 1)
			if err != nil {
				t.Error(err)
				return
			}
			got[slot] = ids[0]
			_ = s.Release(slot)
		}(slot)
	}
	wg.Wait()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("from goroutines %v, alone %v", got, want)
	}
	// Close during calls: goroutines generating in a loop (prefilling again when their slot
	// is full) until they see ErrClosed; Close waits for the call in progress, and no call
	// fails otherwise.
	full := make([]int, slots)
	var steps atomic.Int64
	started := make(chan struct{}, slots)
	errs = make(chan error, slots)
	for slot := 0; slot < slots; slot++ {
		wg.Add(1)
		go func(slot int) {
			defer wg.Done()
			err := s.Prefill(slot, prompt(slot), 0)
			started <- struct{}{}
			for err == nil {
				_, err = s.Generate(slot, 1)
				steps.Add(1)
				// A step runs every live slot: when one is full, each refills its own.
				if errors.Is(err, ErrInvalidArgument) && strings.Contains(err.Error(),
					"has room for") {
					full[slot]++
					err = s.Prefill(slot, prompt(slot), 0)
				}
			}
			errs <- err
		}(slot)
	}
	for slot := 0; slot < slots; slot++ {
		<-started
	}
	// Enough steps that slots fill and refill (61 steps fill one), unless the sanitizers
	// make each step ten times slower.
	least := int64(150)
	if Sanitized() {
		least = 20
	}
	for steps.Load() < least {
		time.Sleep(time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != ErrClosed {
			t.Fatalf("a call racing Close: %v", err)
		}
	}
	t.Logf("%d steps, slots refilled %v times before Close", steps.Load(), full)
}
