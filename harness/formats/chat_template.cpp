#include "harness/formats/chat_template.h"

#include "harness/common/error.h"
#include "harness/common/strings.h"
#include "harness/formats/tokenizer.h"

namespace kvb {
namespace {

using Segs = std::vector<ChatSegment>;

ChatSegment text(std::string t) { return {std::move(t), false}; }
ChatSegment special(std::string t) { return {std::move(t), true}; }

// A default system prompt written literally in a ChatML program:
// '<|im_start|>system\nYou are ...<|im_end|>\n' inside one string literal. The newline may be a real
// one or the two characters \n (GGUF converters and tokenizer_config.json differ). Any Jinja
// expression, quote or filter inside means the prompt is computed (e.g. messages[0].content): none.
std::string literal_chatml_system(const std::string& jinja) {
  for (const std::string opener : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    size_t at = 0;
    while ((at = jinja.find(opener, at)) != std::string::npos) {
      const size_t begin = at + opener.size();
      const size_t end = jinja.find("<|im_end|>", begin);
      if (end == std::string::npos) break;
      const std::string body = jinja.substr(begin, end - begin);
      at = begin;
      if (body.empty() || body.find_first_of("'\"{}|") != std::string::npos) continue;
      std::string out;  // unescape \n as the Jinja string literal would
      for (size_t i = 0; i < body.size(); ++i) {
        if (body[i] == '\\' && i + 1 < body.size() && body[i + 1] == 'n') {
          out += '\n';
          ++i;
        } else {
          out += body[i];
        }
      }
      return out;
    }
  }
  return "";
}

// transformers renders Llama 3.1's template with this system block when no system message is given
// (date_string defaults to "26 Jul 2024").
const char* kLlama31System = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";

}  // namespace

const std::vector<std::string>& chat_template_names() {
  static const std::vector<std::string> kNames = {"none", "chatml", "llama3", "mistral", "gemma"};
  return kNames;
}

Segs ChatTemplate::user_open() const {
  if (name == "chatml") {
    Segs s;
    if (!system.empty())
      s = {special("<|im_start|>"), text("system\n" + system), special("<|im_end|>"), text("\n")};
    s.push_back(special("<|im_start|>"));
    s.push_back(text("user\n"));
    return s;
  }
  if (name == "llama3") {
    Segs s;
    if (!system.empty())
      s = {special("<|start_header_id|>"), text("system"), special("<|end_header_id|>"),
           text("\n\n" + system), special("<|eot_id|>")};
    s.push_back(special("<|start_header_id|>"));
    s.push_back(text("user"));
    s.push_back(special("<|end_header_id|>"));
    s.push_back(text("\n\n"));
    return s;
  }
  if (name == "mistral") return {text("[INST] " + (system.empty() ? "" : system + "\n\n"))};
  if (name == "gemma") {
    return {special("<start_of_turn>"), text("user\n" + (system.empty() ? "" : system + "\n\n"))};
  }
  return {};
}

Segs ChatTemplate::user_close() const {
  if (name == "chatml")
    return {special("<|im_end|>"), text("\n"), special("<|im_start|>"), text("assistant\n")};
  if (name == "llama3")
    return {special("<|eot_id|>"), special("<|start_header_id|>"), text("assistant"),
            special("<|end_header_id|>"), text("\n\n")};
  if (name == "mistral") return {text(" [/INST]")};
  if (name == "gemma")
    return {special("<end_of_turn>"), text("\n"), special("<start_of_turn>"), text("model\n")};
  return {};
}

std::string ChatTemplate::describe() const {
  if (!active()) return "none";
  std::string sys = system;
  for (auto& ch : sys)
    if (ch == '\n') ch = ' ';
  return name + (sys.empty() ? "" : " (system: '" + sys + "')");
}

ChatTemplate chat_template_from_jinja(const std::string& jinja, const std::string& source) {
  ChatTemplate t;
  if (jinja.find("<|im_start|>") != std::string::npos) {
    t.name = "chatml";
    t.system = literal_chatml_system(jinja);
  } else if (jinja.find("<|start_header_id|>") != std::string::npos) {
    t.name = "llama3";
    t.bos = true;
    if (jinja.find("Cutting Knowledge Date") != std::string::npos) t.system = kLlama31System;
  } else if (jinja.find("<start_of_turn>") != std::string::npos) {
    t.name = "gemma";
    t.bos = true;
  } else if (jinja.find("[INST]") != std::string::npos) {
    t.name = "mistral";
    t.bos = true;
  } else {
    KVB_FAIL(source, ": chat template of no known family (kvbench renders ",
             join(chat_template_names(), ", "),
             "); pass chat_template=none or name a family");
  }
  return t;
}

ChatTemplate resolve_chat_template(const std::string& name, const std::string& tokenizer_program,
                                   const std::string& source) {
  if (name == "auto") {
    if (tokenizer_program.empty()) return {};
    return chat_template_from_jinja(tokenizer_program, source);
  }
  ChatTemplate t;
  bool known = false;
  for (const auto& n : chat_template_names()) known = known || n == name;
  KVB_CHECK(known, source, ": unknown chat template '", name, "'",
            did_you_mean(name, chat_template_names()), "; use auto, ",
            join(chat_template_names(), ", "));
  t.name = name;
  t.bos = name == "llama3" || name == "mistral" || name == "gemma";
  return t;
}

std::vector<int64_t> encode_segments(const Tokenizer& tok, const Segs& segs) {
  std::vector<int64_t> ids;
  for (const auto& s : segs) {
    if (s.special) {
      const int64_t id = tok.piece_id(s.text);
      KVB_CHECK(id >= 0, tok.path(), ": the chat template's special token '", s.text,
                "' is not in the vocabulary");
      ids.push_back(id);
    } else if (!s.text.empty()) {
      const auto t = tok.encode(s.text);
      ids.insert(ids.end(), t.begin(), t.end());
    }
  }
  return ids;
}

}  // namespace kvb
