"""kvpress presses that download a calibrated artifact, given kvbench's instead (the qfilters and kvzap
pairs of scripts/peer/kvpress_pairs.py).

QFilterPress downloads `nthngdy/<model>_qfilt` and KVzapPress `nvidia/KVzap-<type>-<model>` from the
Hugging Face hub, DuoAttentionPress its head patterns from the DuoAttention repository (or scores heads
on the fly from BookSum, also a download); none exists for kvb-testbed, and the point of a pair is the press's inference
path, not how its artifact was made. So each press is given what kvbench calibrated on the same
model (a calibration artifact, `<dir>/<method>-<key>.safetensors`, written by the pair's kvbench
runs into the directory below), and its post_init_from_model (which would download) is replaced on
the instance by nothing:
  qfilters  `filters` [layers, kv heads, head_dim] -> QFilterPress.q_filters
  kvzap     `weight` [layers, dim, kv heads], `bias` [layers, kv heads] -> a KVzapModel of type
            linear (one nn.Linear(dim, kv heads) per layer)
  duo_attention  `head_scores` [layers, kv heads] -> DuoAttentionPress's streaming_mask by the
            press's own rule (the round(n ratio) lowest-scored heads stream), with the pair's sink
            and recent sizes
"""

import glob
import os

ARTIFACTS_ENV = "KVB_PEER_ARTIFACTS"  # scripts/peer-kvpress.sh points it into its work directory


def artifact_dir(method):
    root = os.environ.get(ARTIFACTS_ENV, os.path.expanduser("~/.cache/kvbench/peers/artifacts"))
    return os.path.join(root, method)


def load_artifact(method):
    from safetensors.torch import load_file
    files = sorted(glob.glob(os.path.join(artifact_dir(method), f"{method}-*.safetensors")))
    if len(files) != 1:
        raise SystemExit(f"calibrated_presses: expected one kvbench {method} artifact in "
                         f"{artifact_dir(method)}, found {len(files)} (run the pair's kvbench side "
                         "first)")
    return load_file(files[0])


def _no_download(press):
    object.__setattr__(press, "post_init_from_model", lambda model: None)
    return press


def qfilter_press(kp, ratio):
    press = kp.QFilterPress(compression_ratio=ratio)
    press.q_filters = load_artifact("qfilters")["filters"]
    return _no_download(press)


def kvzap_press(kp, ratio):
    import torch
    from kvpress.presses.kvzap_press import KVzapConfig, KVzapModel

    t = load_artifact("kvzap")
    w, b = t["weight"], t["bias"]  # [L, dim, H], [L, H]
    L, dim, H = w.shape
    model = KVzapModel(KVzapConfig(input_dim=dim, output_dim=H, n_modules=L, hidden_dim=None))
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            layer.weight.copy_(w[i].t())
            layer.bias.copy_(b[i])
    press = kp.KVzapPress(compression_ratio=ratio, model_type="linear")
    press.kvzap_model = model
    return _no_download(press)


def duo_attention_press(kp, head_ratio, sink_size, recent_size):
    import numpy as np
    import torch

    scores = load_artifact("duo_attention")["head_scores"].numpy()
    press = kp.DuoAttentionPress(head_compression_ratio=head_ratio)
    n_pruned = round(scores.size * head_ratio)  # post_init_from_model's rule, on kvbench's scores
    mask = torch.zeros(scores.shape, dtype=torch.bool)
    if n_pruned > 0:
        mask[np.unravel_index(np.argsort(scores, axis=None, kind="stable")[:n_pruned], scores.shape)] = True
    press.sink_size, press.recent_size, press.streaming_mask = sink_size, recent_size, mask
    return _no_download(press)
