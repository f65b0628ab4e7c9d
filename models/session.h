// The session's public home is stepgraph/session.h; this name stays for the code that
// includes it from here, with the model loading and random weights it used to bring along.
#ifndef STEPGRAPH_MODELS_SESSION_H_
#define STEPGRAPH_MODELS_SESSION_H_

#include "models/model_files.h"
#include "models/random_weights.h"
#include "stepgraph/session.h"

#endif  // STEPGRAPH_MODELS_SESSION_H_
