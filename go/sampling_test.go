// Per-call sampling (PrefillWith, the *With generation calls) on the built-in model and the
// CPU: a +100 logit bias makes its id every choice, greedy or sampled; a call's temperature
// draws what a sampling session draws; a bad value is refused naming its field.
package stepgraph

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestALogitBiasForcesItsID(t *testing.T) {
	s := cpu(t, 3)
	prompt := []int32{5, 6, 7}
	plain, err := s.GenerateUntil(0, prompt, 6, nil)
	if err != nil {
		t.Fatal(err)
	}
	forced := int32(333)
	if plain[0] == forced {
		forced = 334
	}
	want := []int32{forced, forced, forced, forced, forced, forced}
	for _, o := range []*SamplingOptions{
		{LogitBias: map[int32]float32{forced: 100}},
		{LogitBias: map[int32]float32{forced: 100, 9: -3, 10: 4}, Seed: 9,
			Sampling: &Sampling{Temperature: 2, TopP: 1}},
	} {
		got, err := s.GenerateUntilWith(0, prompt, 6, nil, o)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%+v: %v, want %v", o, got, want)
		}
	}
	// Nothing of a call stays for the next.
	again, err := s.GenerateUntilWith(0, prompt, 6, nil, nil)
	if err != nil || !reflect.DeepEqual(again, plain) {
		t.Fatalf("%v, %v; want %v", again, err, plain)
	}
}

func TestACallsTemperatureIsItsOwn(t *testing.T) {
	hot := &Sampling{Temperature: 8, TopP: 1}
	greedy := cpu(t, 8)
	sampled, err := OpenBuiltin(&Options{MaxSlots: 2, MaxSeq: 32, WeightSeed: 8,
		Backend: BackendCPU, Sampling: hot})
	if err != nil {
		t.Fatal(err)
	}
	defer sampled.Close()
	prompt := []int32{11, 12, 13, 14}
	want, err := sampled.GenerateUntilWith(0, prompt, 12, nil, &SamplingOptions{Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	got, err := greedy.GenerateUntilWith(0, prompt, 12, nil,
		&SamplingOptions{Sampling: hot, Seed: 4})
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%v, %v; want %v", got, err, want)
	}
	plain, _ := greedy.GenerateUntil(0, prompt, 12, nil)
	back, err := sampled.GenerateUntilWith(0, prompt, 12, nil, &SamplingOptions{Greedy: true})
	if err != nil || !reflect.DeepEqual(back, plain) || reflect.DeepEqual(plain, want) {
		t.Fatalf("greedy call %v, %v; greedy session %v, sampled %v", back, err, plain, want)
	}
}

func TestBadSamplingValuesAreRefusedByName(t *testing.T) {
	s := cpu(t, 1)
	vocab := int32(s.Info().VocabSize)
	many := map[int32]float32{}
	for i := int32(0); i < 65; i++ {
		many[i] = 1
	}
	for field, o := range map[string]*SamplingOptions{
		"repetition_penalty":   {RepetitionPenalty: -1},
		"presence_penalty":     {PresencePenalty: 2.5},
		"min_p":                {MinP: 1.5},
		"logit_bias_ids[0]":    {LogitBias: map[int32]float32{vocab: 1}},
		"logit_bias_values[0]": {LogitBias: map[int32]float32{1: 101}},
		"logit_bias_count":     {LogitBias: many},
		"top_p":                {Sampling: &Sampling{Temperature: 1, TopP: 0}},
	} {
		err := s.PrefillWith(0, []int32{1, 2, 3}, o)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", field, err)
		}
	}
	if err := s.PrefillWith(0, []int32{1, 2, 3}, &SamplingOptions{}); err != nil {
		t.Fatal(err)
	}
}
