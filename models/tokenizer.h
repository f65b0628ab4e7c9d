// The tokenizer's public home is stepgraph/tokenizer.h; this name stays for the code that
// includes it from here.
#ifndef STEPGRAPH_MODELS_TOKENIZER_H_
#define STEPGRAPH_MODELS_TOKENIZER_H_

#include "stepgraph/tokenizer.h"

#endif  // STEPGRAPH_MODELS_TOKENIZER_H_
