#pragma once
// A GGUF file's tokenizer (`tokenizer.ggml.*` metadata, as llama.cpp writes it):
//   - model "gpt2": byte-level BPE (tokens, merges "a b" in rank order, token_type, and
//     tokenizer.ggml.pre naming the pre-tokenizer as llama.cpp does) -> a TokenizerSpec;
//   - model "llama": SentencePiece BPE (tokens, scores, token_type) -> the SentencePiece backend.
// Unknown models and pre-tokenizer names are refused, naming the file and the key. Torch-free.
//
// This is the one file that needs the GGUF reader (gguf.cpp); CMake leaves it out of the build
// while the tree has no gguf.cpp, and kvb::Tokenizer then refuses .gguf paths with that reason.

#include <memory>

#include "harness/formats/gguf.h"
#include "harness/formats/tokenizer_backend.h"
#include "harness/formats/tokenizer_spec.h"

namespace kvb {

// The byte-level BPE spec of a "gpt2" GGUF; throws for any other tokenizer.ggml.model.
TokenizerSpec tokenizer_spec_from_gguf(const GgufFile& f);
// The backend for any supported GGUF tokenizer.
std::shared_ptr<const TokenizerBackend> tokenizer_backend_from_gguf(const GgufFile& f);

}  // namespace kvb
