#pragma once
// Chat templates for instruct models: how one user message is wrapped so that the model answers it as
// its fine-tuning taught (ChatML for Qwen and SmolLM2, Llama 3's header ids, Mistral's [INST], Gemma's
// turns). Torch-free.
//
// Checkpoints ship the template as a Jinja program (tokenizer_config.json `chat_template`, GGUF
// `tokenizer.chat_template`). kvbench does not run Jinja: it recognises the family by the markers the
// program emits and renders the family's single-user-turn form itself, taking a default system prompt
// that the program writes literally (SmolLM2's and Qwen2's do) from the program. A template of no known
// family is refused, never rendered approximately. The rendered form of each family is checked in the
// tests against the strings transformers' apply_chat_template produces.
//
// A template renders as segments: text (tokenized as usual) and special tokens (looked up by name in the
// vocabulary, so their ids do not depend on the tokenizer splitting special tokens out of text).

#include <cstdint>
#include <string>
#include <vector>

namespace kvb {

class Tokenizer;

struct ChatSegment {
  std::string text;
  bool special = false;  // a special token's name (e.g. "<|im_start|>"), not text
};

struct ChatTemplate {
  std::string name = "none";  // none | chatml | llama3 | mistral | gemma
  std::string system;         // the system turn's text; "" = no system turn
  bool bos = false;           // the rendering starts with the tokenizer's BOS (Llama 3, Mistral, Gemma)

  bool active() const { return name != "none"; }
  // Everything before the user's message: [BOS] [system turn] user-turn opener.
  std::vector<ChatSegment> user_open() const;
  // Everything after it: the user-turn closer and the assistant-turn opener (the generation prompt).
  std::vector<ChatSegment> user_close() const;
  // A one-line description recorded with runs ("chatml (system: 'You are ...')").
  std::string describe() const;
};

// The family names kvbench renders, and "none".
const std::vector<std::string>& chat_template_names();

// The family of a Jinja template program, with its literal default system prompt when it has one.
// Throws kvb::Error naming `source` when the program belongs to no known family.
ChatTemplate chat_template_from_jinja(const std::string& jinja, const std::string& source);

// A template chosen by name: "none", a family name (with the family's usual default system prompt:
// none for chatml/mistral/gemma, Llama 3.1's knowledge-date block for llama3 only via the program), or
// "auto": the tokenizer's own program `tokenizer_program` (Tokenizer::chat_template()) when it is
// non-empty, else none. Throws kvb::Error naming `source` for an unknown name.
ChatTemplate resolve_chat_template(const std::string& name, const std::string& tokenizer_program,
                                   const std::string& source);

// Token ids of segments: text through tok.encode, special tokens by their vocabulary id. Throws
// kvb::Error naming the token when the vocabulary lacks it.
std::vector<int64_t> encode_segments(const Tokenizer& tok, const std::vector<ChatSegment>& segs);

}  // namespace kvb
