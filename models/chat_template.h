// Chat templates' public home is stepgraph/chat_template.h; this name stays for the code
// that includes it from here.
#ifndef STEPGRAPH_MODELS_CHAT_TEMPLATE_H_
#define STEPGRAPH_MODELS_CHAT_TEMPLATE_H_

#include "stepgraph/chat_template.h"

#endif  // STEPGRAPH_MODELS_CHAT_TEMPLATE_H_
