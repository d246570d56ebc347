"""Our Audiobox Aesthetics loader (bestofn.backends.audiobox) against the published package's own
model, at real size with random weights: the package's ``AesMultiOutput`` is built, saved in the
hub layout (config.json + model.safetensors), loaded by our loader, and both run on three 10 s
windows (one whole, two padded). Prints the largest difference per hidden state on the valid
frames, whether the frame masks agree, and the four outputs of each.

The package is not a dependency (it requires torchaudio): unpack its wheel somewhere first,

    pip download --no-deps audiobox-aesthetics==0.0.4 -d /tmp/abx
    unzip -q /tmp/abx/audiobox_aesthetics-0.0.4-py3-none-any.whl -d /tmp/abx/whl
    PYTHONPATH=src python3 -m lab.probes.audiobox_parity --package-dir /tmp/abx/whl

(its model code imports only torch and huggingface_hub).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--package-dir", required=True, help="the unpacked audiobox-aesthetics wheel")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sys.path.insert(0, args.package_dir)
    from audiobox_aesthetics.model.aes import AesMultiOutput
    from safetensors.torch import save_file

    from bestofn.backends.audiobox import AXES, load_model

    torch.manual_seed(args.seed)
    transform = {a: {"mean": 5.0 + i, "std": 1.5 + i / 10} for i, a in enumerate(AXES)}
    ref = AesMultiOutput(target_transform=transform).eval()
    with torch.no_grad():  # away from the constructor's uniform mixes and unit norms
        for name, p in ref.named_parameters():
            if any(k in name for k in ("layer_weights", "grep_a", "norm")):
                p.add_(0.3 * torch.randn_like(p))
    fields = {k: getattr(ref, k) for k in ("proj_num_layer", "proj_ln", "proj_act_fn",
              "nth_layer", "use_weighted_layer_sum", "normalize_embed", "output_dim")}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        save_file(
            {k: v.contiguous() for k, v in ref.state_dict().items()}, f"{tmp}/model.safetensors"
        )
        Path(tmp, "config.json").write_text(json.dumps({**fields, "target_transform": transform}))
        ours, _ = load_model(tmp)
    g = torch.Generator().manual_seed(args.seed + 1)
    wav = 0.1 * torch.randn(3, 160000, generator=g)
    mask = torch.ones(3, 160000, dtype=torch.bool)
    for row, valid in ((1, 50000), (2, 123457)):
        mask[row, valid:] = False
        wav[row, valid:] = 0
    with torch.inference_mode():
        out = ref({"wav": wav[:, None], "mask": mask[:, None]})
        scale = torch.tensor([[transform[a]["std"] for a in AXES]])
        shift = torch.tensor([[transform[a]["mean"] for a in AXES]])
        theirs = torch.stack([out[a] for a in AXES], -1) * scale + shift
        mine = ours(wav, mask)
        (_, layers), padding = ref.wavlm_model.extract_features(
            source=wav, padding_mask=~mask, output_layer=13, ret_layer_results=True
        )
        states, frames = ours.hidden_states(wav, mask)
    same = torch.equal(~padding, frames)
    print(f"frame masks equal: {same} (valid frames {frames.sum(1).tolist()})")
    for i, ((x, _), s) in enumerate(zip(layers, states, strict=True)):
        diff = (x.transpose(0, 1) - s)[frames].abs().max().item()
        print(f"state {i:2d}: max |diff| on valid frames {diff:.3g}")
    print(
        f"package outputs:\n{theirs}\nours:\n{mine}\nmax |diff| {(theirs - mine).abs().max():.3g}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
