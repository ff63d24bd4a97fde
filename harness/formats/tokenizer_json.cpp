#include "harness/formats/tokenizer_json.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/mapped_file.h"
#include "harness/formats/pre_tokenizer.h"

namespace kvb {

namespace {

using json = nlohmann::json;

constexpr const char* kMetaspace = "\xE2\x96\x81";

struct Reader {
  const std::string& src;

  const json& field(const json& obj, const char* key, const std::string& where) const {
    KVB_CHECK(obj.is_object(), src, ": ", where, " is not an object");
    auto it = obj.find(key);
    KVB_CHECK(it != obj.end(), src, ": ", where, ".", key, " is missing");
    return *it;
  }
  std::string str(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    KVB_CHECK(v.is_string(), src, ": ", where, ".", key, " is not a string");
    return v.get<std::string>();
  }
  // A boolean that may be absent (then `dflt`) but not of another type.
  bool flag(const json& obj, const char* key, const std::string& where, bool dflt) const {
    KVB_CHECK(obj.is_object(), src, ": ", where, " is not an object");
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return dflt;
    KVB_CHECK(it->is_boolean(), src, ": ", where, ".", key, " is not a boolean");
    return it->get<bool>();
  }
  int64_t id(const json& v, const std::string& where) const {
    KVB_CHECK(v.is_number_integer(), src, ": ", where, " is not an integer id");
    const int64_t x = v.get<int64_t>();
    KVB_CHECK(x >= 0 && x < kMaxTokenizerVocab, src, ": ", where, " = ", x, " is outside [0, ",
              kMaxTokenizerVocab, ")");
    return x;
  }
  std::string type(const json& obj, const std::string& where) const {
    return str(obj, "type", where);
  }
};

void read_normalizer(const Reader& r, const json& n, const std::string& where,
                     TokenizerSpec* spec) {
  if (n.is_null()) return;
  const std::string t = r.type(n, where);
  if (t == "Sequence") {
    const json& list = r.field(n, "normalizers", where);
    KVB_CHECK(list.is_array(), r.src, ": ", where, ".normalizers is not an array");
    for (size_t k = 0; k < list.size(); ++k)
      read_normalizer(r, list[k], where + ".normalizers[" + std::to_string(k) + "]", spec);
  } else if (t == "NFC") {
    spec->normalizers.push_back({NormalizerStep::Type::kNfc, "", ""});
  } else if (t == "Prepend") {
    spec->normalizers.push_back({NormalizerStep::Type::kPrepend, r.str(n, "prepend", where), ""});
  } else if (t == "Replace") {
    const json& pat = r.field(n, "pattern", where);
    KVB_CHECK(pat.is_object() && pat.contains("String") && pat["String"].is_string(), r.src, ": ",
              where, ".pattern: only a {\"String\": ...} pattern is supported");
    spec->normalizers.push_back({NormalizerStep::Type::kReplace, pat["String"].get<std::string>(),
                                 r.str(n, "content", where)});
  } else {
    KVB_FAIL(r.src, ": ", where, ".type '", t,
             "' is not supported (supported: NFC, Prepend, Replace, Sequence)");
  }
}

constexpr size_t kMaxPreTokenizerSteps = 64;

void read_pre_tokenizer(const Reader& r, const json& p, const std::string& where,
                        TokenizerSpec* spec) {
  if (p.is_null()) return;
  const std::string t = r.type(p, where);
  PreTokenizerStep st;
  if (t == "Sequence") {
    const json& list = r.field(p, "pretokenizers", where);
    KVB_CHECK(list.is_array(), r.src, ": ", where, ".pretokenizers is not an array");
    for (size_t k = 0; k < list.size(); ++k) {
      read_pre_tokenizer(r, list[k], where + ".pretokenizers[" + std::to_string(k) + "]", spec);
      // Every step is a pass over the whole text; real files chain at most four.
      KVB_CHECK(spec->pre_tokenizers.size() <= kMaxPreTokenizerSteps, r.src, ": ", where,
                ": more than ", kMaxPreTokenizerSteps, " pre-tokenizer steps");
    }
    return;
  } else if (t == "Split") {
    const json& pat = r.field(p, "pattern", where);
    KVB_CHECK(pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string(), r.src, ": ",
              where, ".pattern: only a {\"Regex\": ...} pattern is supported");
    const std::string re = pat["Regex"].get<std::string>();
    KVB_CHECK(split_regex_from_pattern(re, &st.regex), r.src, ": ", where, ".pattern.Regex '", re,
              "' is not one kvbench implements (the GPT-2, Llama 3 and Qwen2 patterns)");
    const std::string behavior = r.str(p, "behavior", where);
    KVB_CHECK(behavior == "Isolated", r.src, ": ", where, ".behavior '", behavior,
              "' is not supported (only Isolated)");
    KVB_CHECK(!r.flag(p, "invert", where, false), r.src, ": ", where, ".invert is not supported");
    st.type = PreTokenizerStep::Type::kSplit;
  } else if (t == "ByteLevel") {
    // Each ByteLevel step maps every byte to a character of up to two bytes: a chain of them
    // doubles the text per step (30 steps: a gigabyte per byte of input). Real files have one.
    KVB_CHECK(!spec->byte_level, r.src, ": ", where,
              ": a second ByteLevel pre-tokenizer is not supported (one maps the bytes; another "
              "would map its output again, doubling the text)");
    st.type = PreTokenizerStep::Type::kByteLevel;
    st.add_prefix_space = r.flag(p, "add_prefix_space", where, true);
    st.use_regex = r.flag(p, "use_regex", where, true);
    spec->byte_level = true;
  } else if (t == "Digits") {
    st.type = PreTokenizerStep::Type::kDigits;
    st.individual_digits = r.flag(p, "individual_digits", where, false);
  } else if (t == "Metaspace") {
    st.type = PreTokenizerStep::Type::kMetaspace;
    KVB_CHECK(r.str(p, "replacement", where) == kMetaspace, r.src, ": ", where,
              ".replacement: only U+2581 is supported");
    KVB_CHECK(!r.flag(p, "split", where, false), r.src, ": ", where,
              ".split = true is not supported");
    std::string scheme = "always";
    if (p.contains("prepend_scheme"))
      scheme = r.str(p, "prepend_scheme", where);
    else if (!r.flag(p, "add_prefix_space", where, true))
      scheme = "never";
    KVB_CHECK(scheme == "always" || scheme == "first" || scheme == "never", r.src, ": ", where,
              ".prepend_scheme '", scheme, "' is not one of always, first, never");
    st.add_prefix_space = scheme != "never";
    st.prefix_first_only = scheme == "first";
  } else {
    KVB_FAIL(r.src, ": ", where, ".type '", t,
             "' is not supported (supported: Split, ByteLevel, Digits, Metaspace, Sequence)");
  }
  spec->pre_tokenizers.push_back(st);
}

int64_t special_token_id(const Reader& r, const json& specials, const std::string& name,
                         const std::string& where) {
  const json& tok = r.field(specials, name.c_str(), where + ".special_tokens");
  const json& ids = r.field(tok, "ids", where + ".special_tokens." + name);
  KVB_CHECK(ids.is_array() && ids.size() == 1, r.src, ": ", where, ".special_tokens.", name,
            ".ids must hold exactly one id");
  return r.id(ids[0], where + ".special_tokens." + name + ".ids[0]");
}

void read_post_processor(const Reader& r, const json& p, const std::string& where,
                         TokenizerSpec* spec) {
  if (p.is_null()) return;
  const std::string t = r.type(p, where);
  if (t == "Sequence") {
    const json& list = r.field(p, "processors", where);
    KVB_CHECK(list.is_array(), r.src, ": ", where, ".processors is not an array");
    for (size_t k = 0; k < list.size(); ++k)
      read_post_processor(r, list[k], where + ".processors[" + std::to_string(k) + "]", spec);
  } else if (t == "ByteLevel") {
    // Offsets only; adds no tokens.
  } else if (t == "TemplateProcessing") {
    // Single-sequence template: [SpecialToken]* Sequence(A) [SpecialToken]*; one before A is BOS,
    // one after it EOS.
    const json& single = r.field(p, "single", where);
    const json& specials = r.field(p, "special_tokens", where);
    KVB_CHECK(single.is_array(), r.src, ": ", where, ".single is not an array");
    bool seen_a = false;
    int n_before = 0, n_after = 0;
    for (size_t k = 0; k < single.size(); ++k) {
      const std::string w = where + ".single[" + std::to_string(k) + "]";
      const json& item = single[k];
      if (item.is_object() && item.contains("Sequence")) {
        KVB_CHECK(!seen_a, r.src, ": ", w, ": a second sequence in a single template");
        seen_a = true;
      } else if (item.is_object() && item.contains("SpecialToken")) {
        const int64_t id =
            special_token_id(r, specials, r.str(item["SpecialToken"], "id", w), where);
        if (!seen_a) {
          spec->bos_id = id;
          spec->add_bos = true;
          ++n_before;
        } else {
          spec->eos_id = id;
          spec->add_eos = true;
          ++n_after;
        }
      } else {
        KVB_FAIL(r.src, ": ", w, " is neither a Sequence nor a SpecialToken");
      }
    }
    KVB_CHECK(seen_a && n_before <= 1 && n_after <= 1, r.src, ": ", where,
              ".single: only [BOS] A [EOS] templates are supported");
  } else if (t == "RobertaProcessing" || t == "BertProcessing") {
    const json& cls = r.field(p, "cls", where);
    const json& sep = r.field(p, "sep", where);
    KVB_CHECK(cls.is_array() && cls.size() == 2 && sep.is_array() && sep.size() == 2, r.src, ": ",
              where, ".cls/.sep must be [token, id] pairs");
    spec->bos_id = r.id(cls[1], where + ".cls[1]");
    spec->eos_id = r.id(sep[1], where + ".sep[1]");
    spec->add_bos = spec->add_eos = true;
  } else {
    KVB_FAIL(r.src, ": ", where, ".type '", t,
             "' is not supported (supported: TemplateProcessing, ByteLevel, RobertaProcessing, "
             "BertProcessing, Sequence)");
  }
}

void read_decoder(const Reader& r, const json& d, const std::string& where, TokenizerSpec* spec) {
  KVB_CHECK(!d.is_null(), r.src, ": ", where, " is null (kvbench needs the decoder to decode)");
  const std::string t = r.type(d, where);
  if (t == "ByteLevel") {
    KVB_CHECK(spec->byte_level, r.src, ": ", where,
              ": a ByteLevel decoder without a ByteLevel pre-tokenizer is not supported");
    return;
  }
  KVB_CHECK(!spec->byte_level, r.src, ": ", where, ".type '", t,
            "': a byte-level pre-tokenizer needs the ByteLevel decoder");
  KVB_CHECK(t == "Sequence", r.src, ": ", where, ".type '", t,
            "' is not supported (supported: ByteLevel, or the SentencePiece-style Sequence of "
            "Replace, ByteFallback, Fuse, Strip)");
  // Exactly the chain tokenizers' Llama/Mistral converters write, in this order; the optional steps
  // may be absent.
  const json& list = r.field(d, "decoders", where);
  KVB_CHECK(list.is_array(), r.src, ": ", where, ".decoders is not an array");
  int stage = 0;  // 0 Replace, 1 ByteFallback, 2 Fuse, 3 Strip
  bool saw_replace = false;
  for (size_t k = 0; k < list.size(); ++k) {
    const std::string w = where + ".decoders[" + std::to_string(k) + "]";
    const std::string dt = r.type(list[k], w);
    if (dt == "Replace" && stage == 0) {
      const json& pat = r.field(list[k], "pattern", w);
      KVB_CHECK(pat.is_object() && pat.contains("String") && pat["String"] == kMetaspace &&
                    r.str(list[k], "content", w) == " ",
                r.src, ": ", w, ": only Replace(U+2581 -> ' ') is supported");
      saw_replace = true;
      stage = 1;
    } else if (dt == "ByteFallback" && stage <= 1) {
      stage = 2;
    } else if (dt == "Fuse" && stage <= 2) {
      stage = 3;
    } else if (dt == "Strip" && stage <= 3) {
      const json& start = r.field(list[k], "start", w);
      const json& stop = r.field(list[k], "stop", w);
      KVB_CHECK(r.str(list[k], "content", w) == " " && start.is_number_integer() &&
                    start.get<int64_t>() <= 1 && stop == 0,
                r.src, ": ", w, ": only Strip(' ', start <= 1, stop 0) is supported");
      spec->decode_strip_leading_space = start.get<int64_t>() == 1;
      stage = 4;
    } else {
      KVB_FAIL(r.src, ": ", w, ".type '", dt,
               "' is not supported here (the chain must be Replace, ByteFallback, Fuse, Strip)");
    }
  }
  KVB_CHECK(saw_replace, r.src, ": ", where, ": the decoder chain has no Replace(U+2581 -> ' ')");
}

// tokenizer_config.json's "bos_token"/"eos_token": a string or {"content": ...}; "" when absent.
std::string config_token(const Reader& r, const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  KVB_CHECK(it->is_object() && it->contains("content") && (*it)["content"].is_string(), r.src, ": ",
            key, " is neither a string nor an object with \"content\"");
  return (*it)["content"].get<std::string>();
}

}  // namespace

TokenizerSpec tokenizer_spec_from_json(const std::string& text, const std::string& source,
                                       const std::string& config_text,
                                       const std::string& config_source,
                                       const std::string& model_config_text,
                                       const std::string& model_config_source) {
  const json j = parse_json(text, source);
  Reader r{source};
  KVB_CHECK(j.is_object(), source, ": not a tokenizer.json (the top level is not an object)");
  TokenizerSpec spec;
  spec.source = source;
  spec.format = "tokenizer.json";

  const json& model = r.field(j, "model", "(top level)");
  const std::string mtype = r.type(model, "model");
  KVB_CHECK(mtype == "BPE", source, ": model.type '", mtype,
            "' is not supported (only BPE; WordPiece, WordLevel and Unigram are not)");
  KVB_CHECK(!model.contains("dropout") || model["dropout"].is_null(), source,
            ": model.dropout is set (BPE dropout is not deterministic; not supported)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(k);
    KVB_CHECK(
        it == model.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty()),
        source, ": model.", k, " is set (not supported)");
  }
  spec.byte_fallback = r.flag(model, "byte_fallback", "model", false);
  spec.fuse_unk = r.flag(model, "fuse_unk", "model", false);
  spec.ignore_merges = r.flag(model, "ignore_merges", "model", false);

  const json& vocab = r.field(model, "vocab", "model");
  KVB_CHECK(vocab.is_object(), source, ": model.vocab is not an object");
  KVB_CHECK(!vocab.empty(), source, ": model.vocab is empty");
  KVB_CHECK(static_cast<int64_t>(vocab.size()) <= kMaxTokenizerVocab, source, ": model.vocab has ",
            vocab.size(), " tokens, more than the ", kMaxTokenizerVocab, " any real tokenizer has");
  spec.tokens.assign(vocab.size(), std::string());
  std::vector<uint8_t> seen(vocab.size(), 0);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int64_t id = r.id(it.value(), "model.vocab['" + it.key() + "']");
    KVB_CHECK(id < static_cast<int64_t>(vocab.size()), source, ": model.vocab['", it.key(),
              "'] = ", id, " is outside [0, ", vocab.size(),
              ") (the vocabulary must number its tokens densely)");
    KVB_CHECK(!seen[static_cast<size_t>(id)], source, ": model.vocab: id ", id,
              " is given to two tokens ('", spec.tokens[static_cast<size_t>(id)], "' and '",
              it.key(), "')");
    seen[static_cast<size_t>(id)] = 1;
    spec.tokens[static_cast<size_t>(id)] = it.key();
  }

  auto mit = model.find("merges");
  KVB_CHECK(mit != model.end() && mit->is_array(), source,
            ": model.merges is missing or not an array");
  spec.merges.reserve(mit->size());
  for (size_t k = 0; k < mit->size(); ++k) {
    const json& m = (*mit)[k];
    if (m.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      KVB_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() &&
                    s.find(' ', sp + 1) == std::string::npos,
                source, ": model.merges[", k, "] '", s,
                "' is not two tokens separated by one space");
      spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {  // ["a", "b"] (tokenizers >= 0.20)
      KVB_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), source,
                ": model.merges[", k, "] is neither \"a b\" nor [\"a\", \"b\"]");
      spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }

  auto uit = model.find("unk_token");
  if (uit != model.end() && !uit->is_null()) {
    KVB_CHECK(uit->is_string(), source, ": model.unk_token is not a string");
    auto v = vocab.find(uit->get<std::string>());
    KVB_CHECK(v != vocab.end(), source, ": model.unk_token '", uit->get<std::string>(),
              "' is not in model.vocab");
    spec.unk_id = v->get<int64_t>();
  }

  if (j.contains("added_tokens")) {
    const json& added = j["added_tokens"];
    KVB_CHECK(added.is_array(), source, ": added_tokens is not an array");
    for (size_t k = 0; k < added.size(); ++k) {
      const std::string w = "added_tokens[" + std::to_string(k) + "]";
      AddedToken a;
      a.id = r.id(r.field(added[k], "id", w), w + ".id");
      a.content = r.str(added[k], "content", w);
      a.special = r.flag(added[k], "special", w, false);
      a.lstrip = r.flag(added[k], "lstrip", w, false);
      a.rstrip = r.flag(added[k], "rstrip", w, false);
      a.single_word = r.flag(added[k], "single_word", w, false);
      a.normalized = r.flag(added[k], "normalized", w, !a.special);
      spec.added.push_back(std::move(a));
    }
  }

  if (j.contains("normalizer")) read_normalizer(r, j["normalizer"], "normalizer", &spec);
  if (j.contains("pre_tokenizer"))
    read_pre_tokenizer(r, j["pre_tokenizer"], "pre_tokenizer", &spec);
  if (j.contains("post_processor"))
    read_post_processor(r, j["post_processor"], "post_processor", &spec);
  read_decoder(r, j.contains("decoder") ? j["decoder"] : json(), "decoder", &spec);

  // Token names for ids the file does not assign: tokenizer_config.json when present, else the
  // names these families use.
  auto id_of = [&](const std::string& name) -> int64_t {
    for (const AddedToken& a : spec.added)
      if (a.content == name) return a.id;
    auto v = vocab.find(name);
    return v == vocab.end() ? -1 : v->get<int64_t>();
  };
  std::string cfg_bos, cfg_eos;
  if (!config_text.empty()) {
    const json cfg = parse_json(config_text, config_source);
    Reader cr{config_source};
    KVB_CHECK(cfg.is_object(), config_source, ": the top level is not an object");
    cfg_bos = config_token(cr, cfg, "bos_token");
    cfg_eos = config_token(cr, cfg, "eos_token");
    auto ct = cfg.find("chat_template");
    if (ct != cfg.end() && !ct->is_null()) {
      if (ct->is_string()) {
        spec.chat_template = ct->get<std::string>();
      } else {
        // A list of {"name", "template"}: the one named "default", else the first.
        KVB_CHECK(ct->is_array() && !ct->empty(), config_source,
                  ": chat_template is neither a string nor a list of named templates");
        for (const json& e : *ct) {
          KVB_CHECK(e.is_object() && e.contains("template") && e["template"].is_string(),
                    config_source, ": chat_template: an entry without a \"template\" string");
          if (spec.chat_template.empty() || (e.contains("name") && e["name"] == "default"))
            spec.chat_template = e["template"].get<std::string>();
        }
      }
    }
    for (const auto& [key, name] :
         {std::pair<const char*, std::string>{"bos_token", cfg_bos}, {"eos_token", cfg_eos}})
      KVB_CHECK(name.empty() || id_of(name) >= 0, config_source, ": ", key, " '", name,
                "' is not a token of ", source);
  }
  int64_t model_bos = -1, model_eos = -1;
  if (!model_config_text.empty()) {
    const json mc = parse_json(model_config_text, model_config_source);
    Reader mr{model_config_source};
    int64_t n_ids = static_cast<int64_t>(spec.tokens.size());
    for (const AddedToken& a : spec.added) n_ids = std::max(n_ids, a.id + 1);
    for (auto [key, out] : {std::pair<const char*, int64_t*>{"bos_token_id", &model_bos},
                            {"eos_token_id", &model_eos}}) {
      if (!mc.is_object() || !mc.contains(key) || !mc[key].is_number_integer()) continue;
      *out = mr.id(mc[key], key);
      KVB_CHECK(*out < n_ids, model_config_source, ": ", key, " = ", *out,
                " is outside the vocabulary of ", source);
    }
  }
  if (spec.bos_id < 0 && cfg_bos.empty() && model_bos >= 0) spec.bos_id = model_bos;
  if (spec.eos_id < 0 && cfg_eos.empty() && model_eos >= 0) spec.eos_id = model_eos;
  if (spec.bos_id < 0) {
    for (const std::string& n : {cfg_bos, std::string("<|begin_of_text|>"), std::string("<s>"),
                                 std::string("<|endoftext|>")})
      if (spec.bos_id < 0 && !n.empty()) spec.bos_id = id_of(n);
  }
  if (!cfg_eos.empty()) spec.eos_id = id_of(cfg_eos);
  if (spec.eos_id < 0) {
    for (const char* n : {"<|end_of_text|>", "</s>", "<|endoftext|>"})
      if (spec.eos_id < 0) spec.eos_id = id_of(n);
  }
  return spec;
}

TokenizerSpec tokenizer_spec_from_json_file(const std::string& path) {
  KVB_CHECK(file_exists(path), path, ": tokenizer file not found");
  const size_t slash = path.find_last_of('/');
  const std::string cfg = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) +
                          "tokenizer_config.json";
  const std::string model_cfg =
      (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + "config.json";
  const std::string cfg_text = file_exists(cfg) ? read_text_file(cfg) : std::string();
  const std::string model_text = file_exists(model_cfg) ? read_text_file(model_cfg) : std::string();
  return tokenizer_spec_from_json(read_text_file(path), path, cfg_text, cfg, model_text, model_cfg);
}

}  // namespace kvb
