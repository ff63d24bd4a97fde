#pragma once
// Whether a model's files changed, without reading them (harness/model/model.cpp).

#include <string>

namespace kvb {

// The identity of the files a model spec loads from, without reading them: a FastHash of each
// file's name, size, modification and change times and inode (a Hugging Face directory's files, or
// the .bin / .gguf with its tokenizer). Equal means the files were not replaced since; different
// means they may have been (Model::content_hash tells). "" for a synthetic model.
std::string model_files_identity(const std::string& spec, const std::string& models_dir);

}  // namespace kvb
