import time

import torch
from omegaconf import OmegaConf, open_dict

from bestofn.fakes.parakeet import build
from bestofn.lab.bench.scorers import clips

b = build("cuda", "real")
cfg = b.model.cfg.decoding
print("greedy cfg:", OmegaConf.to_container(cfg.greedy))
inner = b.model.decoding.decoding
print(
    "decoder class:",
    type(inner).__name__,
    {
        k: v
        for k, v in vars(inner).items()
        if "cuda" in k.lower() or "graph" in k.lower() or "loop" in k.lower()
    },
)
audio = clips(64, 15.0, 16000)


def timed():
    torch.cuda.synchronize()
    s = time.perf_counter()
    b.transcribe_batch(audio)
    torch.cuda.synchronize()
    return (time.perf_counter() - s) / 64


for variant in [
    {},
    {"loop_labels": True, "use_cuda_graph_decoder": True},
    {"loop_labels": True, "use_cuda_graph_decoder": False},
    {"loop_labels": False, "use_cuda_graph_decoder": False},
]:
    try:
        with open_dict(cfg):
            cfg.greedy.update(variant)
        b.model.change_decoding_strategy(cfg, verbose=False)
        inner = b.model.decoding.decoding
        timed()
        print(
            variant,
            "s/clip:",
            [round(timed(), 5) for _ in range(3)],
            type(inner).__name__,
            getattr(inner, "cuda_graphs_mode", None),
            getattr(getattr(inner, "decoding_computer", None), "cuda_graphs_mode", None),
        )
    except Exception as e:
        print(variant, "failed:", type(e).__name__, e)
