"""Empathic-Insight and VoiceCLAP bring a batch's values to the host in one copy (one device
sync per batch, not one per head or column): the scores are bit-equal to reading each head's,
each column's tensor on its own, as they were read before."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from bestofn.util.spec import GroupSpec  # noqa: E402

SPEC = GroupSpec(
    "happy", "p1", "hello there", 5, emotion_description="A bright voice.",
    negative_description="A flat voice.",
)  # fmt: skip


def takes(n=5, sr=16000) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [(0.1 * rng.standard_normal(int(sr * (0.6 + 0.2 * k)))).astype(np.float32)
            for k in range(n)]  # fmt: skip


def test_empathic_heads_in_one_copy_are_bit_equal():
    from bestofn.backends.empathic import _to_mono_16k
    from bestofn.fakes import empathic

    scorer = empathic.build("cpu", "tiny", n_emotion_heads=5, n_quality_heads=2, batch_size=2)
    audios = takes()
    got = scorer.score(audios, 16000, SPEC)
    clips = [_to_mono_16k(a, 16000, scorer.max_samples) for a in audios]
    want: dict[str, list] = {}
    for i in range(0, len(clips), scorer.batch_size):  # per head, as before
        for n, y in scorer.heads_from_states(scorer.encode(clips[i : i + 2])).items():
            want.setdefault(scorer.column_of[n], []).extend(float(v) for v in y.cpu())
    assert len(want) == 7
    for column, values in want.items():
        assert got[column] == values, column  # bit-equal, in the takes' order


def test_voiceclap_columns_in_one_copy_are_bit_equal():
    from bestofn.backends.voiceclap import _to_window
    from bestofn.fakes import voiceclap

    scorer = voiceclap.build("cpu", "tiny", batch_size=2)
    audios = takes()
    got = scorer.score(audios, 16000, SPEC)
    want = {c: [] for c in ("vc_genuineness", "vc_blend", "vc_prompt_sim")}
    w, a = scorer.embed_text(SPEC.emotion_description), scorer.embed_text(SPEC.negative_description)
    clips = [_to_window(x, 16000, scorer.window) for x in audios]
    with torch.inference_mode():
        for i in range(0, len(clips), 2):  # each column on its own, as before
            raw = scorer.embed_audio_raw(clips[i : i + 2])
            emb = torch.nn.functional.normalize(raw, dim=-1)
            want["vc_genuineness"] += scorer.genuineness(emb).tolist()
            want["vc_blend"] += scorer.blend(raw).tolist()
            want["vc_prompt_sim"] += (emb @ w - emb @ a).tolist()
    for column, values in want.items():
        assert got[column] == values, column
