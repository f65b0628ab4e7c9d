// Command example generates from the built-in model on the CPU, or, given a model file
// (a GGUF file or a Hugging Face folder with a tokenizer), answers a question with it:
//
//	go run ./example
//	go run ./example ~/.cache/stepgraph-test/SmolLM2-135M-Instruct.Q4_1.gguf
//
// It needs nothing but the libraries in the repository's build folder (go/README.md).
package main

import (
	"fmt"
	"os"

	"stepgraph.dev/stepgraph"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(args []string) error {
	options := &stepgraph.Options{Backend: stepgraph.BackendCPU, MaxSeq: 96}
	if len(args) == 0 {
		s, err := stepgraph.OpenBuiltin(options)
		if err != nil {
			return err
		}
		defer s.Close()
		if err := s.Prefill(0, []int32{1, 2, 3}, 0); err != nil {
			return err
		}
		ids, err := s.Generate(0, 8)
		if err != nil {
			return err
		}
		fmt.Println(ids)
		return nil
	}
	s, err := stepgraph.Open(args[0], options)
	if err != nil {
		return err
	}
	defer s.Close()
	text, err := s.GenerateText(0, "What is the capital of France?",
		stepgraph.EncodeOptions{Chat: true}, 32, true)
	if err != nil {
		return err
	}
	fmt.Println(text)
	return nil
}
