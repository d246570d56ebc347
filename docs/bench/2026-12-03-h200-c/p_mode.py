"""Side A in the main program (as p_inproc.py plain) with NeMo's TDT label-looping computer
forced to one CUDA-graphs mode (full_graph, no_while_loops, no_graphs) before any decode."""

import sys
from pathlib import Path

from nemo.collections.asr.parts.submodules.transducer_decoding import tdt_label_looping as t

from bestofn import ab

mode, cfg, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
cls = t.GreedyBatchedTDTLabelLoopingComputer
_orig = cls.maybe_enable_cuda_graphs


def forced(self):
    _orig(self)
    if self.cuda_graphs_mode is not None:
        self.force_cuda_graphs_mode(mode)
        print(f"probe: cuda_graphs_mode forced to {self.cuda_graphs_mode}", flush=True)
    return True


cls.maybe_enable_cuda_graphs = forced
plan = ab._plan(cfg, Path("."), None)
specs = list(plan.groups.values())[:3]
work.mkdir(parents=True, exist_ok=True)
out = ab.run_side("A", plan.config["models"], specs, plan.config["device"], work, print, None, 1)
print(f"{mode}: side A passed, {out['clips']} clips", flush=True)
