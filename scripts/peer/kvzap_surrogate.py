"""KVzapPress with kvbench's surrogate instead of NVIDIA's (the kvzap pair of
scripts/peer/kvpress_pairs.py).

KVzapPress downloads `nvidia/KVzap-<type>-<model name>` from the Hugging Face hub; there is none for
kvb-testbed, and the point of the pair is the press's inference path, not NVIDIA's training. So the
press is given the linear surrogate kvbench fitted on the same model (`kvbench` writes it as a
calibration artifact, `<cache_dir>/kvzap-<key>.safetensors`: weight [layers, dim, kv heads], bias
[layers, kv heads]) as a KVzapModel of type linear, and its post_init_from_model (which would fetch
NVIDIA's model) is replaced on the instance by nothing.
"""

import glob
import os

ARTIFACT_DIR_ENV = "KVB_PEER_KVZAP_DIR"  # where kvbench's kvzap runs of the pair write their artifact


def artifact_dir():
    return os.environ.get(ARTIFACT_DIR_ENV, os.path.expanduser("~/.cache/kvbench/peers/kvzap"))


def kvzap_press(kp, ratio):
    import torch
    from safetensors.torch import load_file
    from kvpress.presses.kvzap_press import KVzapConfig, KVzapModel

    files = sorted(glob.glob(os.path.join(artifact_dir(), "kvzap-*.safetensors")))
    if len(files) != 1:
        raise SystemExit(f"kvzap_surrogate: expected one kvbench kvzap artifact in {artifact_dir()}, "
                         f"found {len(files)} (run the pair's kvbench side first)")
    t = load_file(files[0])
    w, b = t["weight"], t["bias"]  # [L, dim, H], [L, H]
    L, dim, H = w.shape
    model = KVzapModel(KVzapConfig(input_dim=dim, output_dim=H, n_modules=L, hidden_dim=None))
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            layer.weight.copy_(w[i].t())
            layer.bias.copy_(b[i])
    press = kp.KVzapPress(compression_ratio=ratio, model_type="linear")
    press.kvzap_model = model
    object.__setattr__(press, "post_init_from_model", lambda model: None)
    return press
