// The Llama graphs' public home is stepgraph/llama.h; this name stays for the code that
// includes it from here.
#ifndef STEPGRAPH_MODELS_LLAMA_H_
#define STEPGRAPH_MODELS_LLAMA_H_

#include "stepgraph/llama.h"

#endif  // STEPGRAPH_MODELS_LLAMA_H_
