// The program's conversations are the text room's: sg::ChatConversation renders each turn
// with the model's own chat template (see stepgraph/text/chat_conversation.h). The name
// stays here for the program's commands.
#ifndef STEPGRAPH_TOOLS_CONVERSATION_H_
#define STEPGRAPH_TOOLS_CONVERSATION_H_

#include "stepgraph/text/chat_conversation.h"

namespace sg::cli {

using Conversation = ::sg::ChatConversation;

}  // namespace sg::cli

#endif  // STEPGRAPH_TOOLS_CONVERSATION_H_
