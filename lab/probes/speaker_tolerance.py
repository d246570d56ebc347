"""How far the wavlm-speaker scorer's speed paths move spk_sim, on the real-shaped random
checkpoint (``bestofn.fakes.speaker``) and takes of many lengths: each path's spk_sim against
the model card's usage (each take alone, float32, whole), over the same takes and reference.

Paths: float32 padded batches (the masked batching alone), the runtime default on the device
(bfloat16 body on CUDA, padded batches), and any ``--runtime`` variants (as
``lab.bench scorers --speaker-runtime``). Random weights: the figure bounds rounding and
padding, not what trained weights do on speech (``bestofn ab`` with real weights says that).

    PYTHONPATH=src:. python3 -m lab.probes.speaker_tolerance --takes 64 --seconds 15 --spread 5
CPU smoke: ``--device cpu --size tiny --takes 3 --seconds 1 --spread 0.5``.
"""

from __future__ import annotations

import argparse
import copy
import json

import numpy as np

from lab.probes import write_rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", choices=("real", "tiny"), default="real")
    ap.add_argument("--takes", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--spread", type=float, default=5.0)
    ap.add_argument("--runtime", default="", help="extra variants, e.g. 'max_seconds=6'")
    ap.add_argument("--out", help="write the rows as JSON lines here too")
    args = ap.parse_args(argv)
    import torch

    from bestofn.backends.speaker import SpeakerScorer
    from bestofn.fakes import speaker as fake
    from lab.bench.scorers import clips, runtime_variants

    model = fake.build_model(tiny=args.size == "tiny", seed=7)
    fe = fake.feature_extractor()
    takes = clips(args.takes, args.seconds, 16000, seed=1, spread=args.spread)
    reference = clips(1, args.seconds, 16000, seed=2)[0]

    def sims(scorer, group):
        emb = scorer.embed(group)
        return (emb @ scorer.embed([reference])[0]).float().cpu().numpy()

    exact = SpeakerScorer.from_modules(copy.deepcopy(model), fe, args.device, precision="float32")
    want = np.array([sims(exact, [t])[0] for t in takes])
    variants = [{"precision": "float32"}, {}, *runtime_variants(args.runtime)]
    rows = []
    for kw in variants:
        scorer = SpeakerScorer.from_modules(copy.deepcopy(model), fe, args.device, **kw)
        diff = np.abs(sims(scorer, takes) - want)
        rows.append({
            "runtime": kw or "default", "path": scorer.provenance()["kernel_path"],
            "takes": len(takes), "max_abs_diff": float(diff.max()),
            "mean_abs_diff": float(diff.mean()), "spk_sim_range": float(np.ptp(want)),
        })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
        scorer.close()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    if args.out:
        write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
