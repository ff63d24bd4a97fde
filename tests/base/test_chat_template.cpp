// Chat templates: the family and default system prompt read from real template programs, each family's
// rendering against the string transformers' apply_chat_template gives (one user message, generation
// prompt on), and SmolLM2's rendered ids against its README's reference ids.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/common/error.h"
#include "harness/formats/chat_template.h"
#include "harness/formats/tokenizer.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using ptest::expect_kvb_error;

// SmolLM2-135M-Instruct's program, as its GGUF (tokenizer.chat_template) carries it.
const char* kSmolLM2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% "
    "endif %}";

// As it appears in tokenizer_config.json after JSON decoding: the newline escapes are Jinja's.
const char* kQwen25Escaped =
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You "
    "are a helpful assistant.<|im_end|>\\n' }}{%- endif %}";

// Qwen3's opens with a computed system turn only: no default prompt.
const char* kComputedSystem =
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + "
    "'<|im_end|>\\n' }}{%- endif %}{{- '<|im_start|>' + message.role + '\\n' + content }}";

std::string render(const std::vector<ChatSegment>& segs) {
  std::string out;
  for (const auto& s : segs) out += s.text;
  return out;
}

std::string render_turn(const ChatTemplate& t, const std::string& user) {
  return render(t.user_open()) + user + render(t.user_close());
}

TEST(ChatTemplate, FamilyAndDefaultSystemPromptFromThePrograms) {
  ChatTemplate smol = chat_template_from_jinja(kSmolLM2, "smollm2");
  EXPECT_EQ(smol.name, "chatml");
  EXPECT_EQ(smol.system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_FALSE(smol.bos);

  ChatTemplate qwen = chat_template_from_jinja(kQwen25Escaped, "qwen2.5");
  EXPECT_EQ(qwen.name, "chatml");
  EXPECT_EQ(qwen.system, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");

  ChatTemplate qwen3 = chat_template_from_jinja(kComputedSystem, "qwen3");
  EXPECT_EQ(qwen3.name, "chatml");
  EXPECT_EQ(qwen3.system, "");

  ChatTemplate l31 = chat_template_from_jinja(
      "{{- bos_token }}{%- set date_string = \"26 Jul 2024\" %}{{- \"Cutting Knowledge Date: "
      "December 2023\\n\" }}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}",
      "llama3.1");
  EXPECT_EQ(l31.name, "llama3");
  EXPECT_TRUE(l31.bos);
  EXPECT_EQ(l31.system, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");

  EXPECT_EQ(chat_template_from_jinja("{{ '<start_of_turn>user\\n' }}", "g").name, "gemma");
  EXPECT_EQ(chat_template_from_jinja("{{ '[INST] ' + message['content'] + ' [/INST]' }}", "m").name,
            "mistral");
  expect_kvb_error([] { chat_template_from_jinja("{{ '### Human: ' + content }}", "odd.gguf"); },
                   {"odd.gguf", "no known family", "chat_template=none"});
}

TEST(ChatTemplate, ResolveByName) {
  EXPECT_FALSE(resolve_chat_template("auto", "", "cfg").active());
  EXPECT_EQ(resolve_chat_template("auto", kSmolLM2, "cfg").name, "chatml");
  EXPECT_FALSE(resolve_chat_template("none", kSmolLM2, "cfg").active());
  EXPECT_EQ(resolve_chat_template("gemma", "", "cfg").name, "gemma");
  EXPECT_TRUE(resolve_chat_template("llama3", "", "cfg").bos);
  expect_kvb_error([] { resolve_chat_template("chatm1", "", "config.protocol.chat_template"); },
                   {"config.protocol.chat_template", "'chatm1'", "chatml"});
}

// The strings transformers renders for messages=[{"role": "user", "content": "Hi"}],
// add_generation_prompt=True (BOS written by the tokenizer, not the template text, in the
// families that have one).
TEST(ChatTemplate, EachFamilyRendersAsTransformersDoes) {
  EXPECT_EQ(render_turn(chat_template_from_jinja(kSmolLM2, "s"), "Hi"),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_turn(resolve_chat_template("chatml", "", "c"), "Hi"),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_turn(resolve_chat_template("llama3", "", "c"), "Hi"),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render_turn(resolve_chat_template("gemma", "", "c"), "Hi"),
            "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(render_turn(resolve_chat_template("mistral", "", "c"), "Hi"), "[INST] Hi [/INST]");
  EXPECT_EQ(resolve_chat_template("none", "", "c").describe(), "none");
  EXPECT_EQ(chat_template_from_jinja(kSmolLM2, "s").describe(),
            "chatml (system: 'You are a helpful AI assistant named SmolLM, trained by Hugging Face')");
}

// SmolLM2's README: the chat prompt "What is the capital of France?" is these 37 ids (HF tokenizers on
// the whole rendered string); segment by segment through our tokenizer gives the same.
TEST(ChatTemplate, SmolLM2ChatPromptIdsEqualTheReference) {
  const std::string path = ptest::models_dir() + "/smollm2-135m-instruct/tokenizer.json";
  Tokenizer tok(path);
  const ChatTemplate t = chat_template_from_jinja(kSmolLM2, "smollm2");
  std::vector<int64_t> ids = encode_segments(tok, t.user_open());
  for (int64_t id : tok.encode("What is the capital of France?")) ids.push_back(id);
  for (int64_t id : encode_segments(tok, t.user_close())) ids.push_back(id);
  const std::vector<int64_t> want = {1,    9690, 198,   2683, 359,  253,   5356, 5646,  11173, 3365,
                                     3511, 308,  34519, 28,   7018, 411,   407,  19712, 8182,  2,
                                     198,  1,    4093,  198,  1780, 314,   260,  3575,  282,   4649,
                                     47,   2,    198,   1,    520,  9531,  198};
  EXPECT_EQ(ids, want);
  // A special token the vocabulary lacks is named.
  expect_kvb_error([&] { encode_segments(tok, {{"<start_of_turn>", true}}); },
                   {"tokenizer.json", "'<start_of_turn>'", "not in the vocabulary"});
}

}  // namespace
}  // namespace kvb
