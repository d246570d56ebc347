"""`bestofn fake-weights DIR [--size tiny|real] [--seed N] [--moss-code DIR]`: random-weight
checkpoints for every production backend, in the on-disk layouts of the published ones, plus a
complete production config that points at them.

    DIR/config.yaml                             moss-fast -> sidon -> duration, parakeet,
                                                voiceclap, empathic-insight (model paths
                                                relative to weights_root: DIR)
    DIR/emotions.tsv, prompts.tsv, joe_reference.flac
    DIR/FAKE_WEIGHTS.md                         what is here (VoiceCLAP's modelling code: ours)
    DIR/MOSS-TTS-Local-Transformer-v1.5/        config.json, tokenizer.json, processor_config.json,
                                                model.safetensors (tiny) or shards + index (real)
    DIR/MOSS-Audio-Tokenizer-v2/                the 48 kHz codec of MOSS-TTS-Local, published layout
    DIR/MOSS-Audio-Tokenizer/                   the 24 kHz codec of MOSS-TTS Delay, published layout
    DIR/MOSS-TTS-Delay-v1.5/                    MOSS-TTS Delay (Qwen3-8B shape, 32 codebooks);
                                                skipped with --no-delay
    DIR/w2v-bert-2.0/, DIR/sidon_raw_weight/    Sidon: base encoder, LoRA adapter, decoder
    DIR/parakeet-tdt-0.6b-v3/*.nemo             Parakeet-TDT (NeMo archive)
    DIR/parakeet-tdt-0.6b-v3-CALIBRATED/        the same, its joint calibrated to speech's token
                                                rate (a CALIBRATION; --parakeet calibrated)
    DIR/voiceclap-commercial/, voiceclap-heads/ VoiceCLAP: published file set (our remote code)
    DIR/BUD-E-Whisper/, Empathic-Insight-Voice-Plus/
    DIR/wavlm-base-plus-sv/                     speaker similarity (WavLMForXVector)
    DIR/audiobox-aesthetics/                    optional audio-quality scorer (not in
                                                config.yaml's scorers; a comment there says how)
    DIR/moss-tts-local-transformer-4.55b-voice-acting/, moss-tts-v1.5-8b-voice-acting/
                                                LAION's voice-acting fine-tunes (config/recipes/),
                                                in their bases' layouts (config.json ASSUMED)

``tiny`` runs the whole workflow on a CPU in about a minute (the CI test); ``real`` has the
published sizes (about 40 GB on disk, mostly the 59 Empathic-Insight heads and the 8.5 GB v2
codec) for GPU runs.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import shutil
import time
from pathlib import Path

from bestofn.fakes import check_size
from bestofn.util.declared import declarations

NEED_BYTES = {"tiny": 200 * 2**20, "real": 50 * 2**30}  # what a write needs free, with margin
DELAY_BYTES = {"tiny": 120 * 2**20, "real": 18 * 2**30}  # the Delay checkpoints on top
REFERENCE_VOICE = Path(__file__).resolve().parents[3] / "config" / "voices" / "joe_reference.flac"

# ei_head: the tiny fake heads (bestofn.fakes.empathic NAMED_EMOTION_HEADS[:2]) score the two
EMOTIONS = [
    ["emotion", "description", "reference_audio", "ei_head"],
    ["calm", "A calm, warm voice, speaking slowly.", "{reference}", "Jealousy_&_Envy"],
    ["angry", "An angry voice, loud and sharp.", "", "Anger"],
]
PROMPTS = [
    ["prompt_id", "text"],
    ["p1", "Good morning to you."],
    ["p2", "It is nine o'clock."],
]

# Per size: what differs between a CPU test run and a GPU run.
RUN = {
    "tiny": dict(
        device="cpu",
        generator_options="      min_frames: 8  # tiny only: short takes keep the CPU run fast\n"
        "      max_frames: 16\n",
        generator_runtime="{batch_size: 4, decode_batch_size: 4}",
        restorer_runtime="{batch_size: 4}",
        parakeet_runtime="{batch_size: 4}",
        scorer_runtime="{batch_size: 4}",
        queue_depth=2,  # the CPU profile (profiles/local) runs 2 group jobs at once
        idle_timeout_s=120,
        start_timeout_s=600,
    ),
    "real": dict(
        device="cuda",
        generator_options="",
        # as config/recipes/base.yaml
        generator_runtime="{batch_size: 64, decode_batch_size: 64, pair_groups: true}",
        restorer_runtime="{batch_size: 32}",
        parakeet_runtime="{batch_size: 128}",  # as config/recipes/base.yaml
        scorer_runtime="{batch_size: 32}",
        queue_depth=4,  # as config/recipes/*.yaml: pairing needs 4
        idle_timeout_s=600,
        start_timeout_s=1800,
    ),
}

CONFIG = """\
# Written by `bestofn fake-weights {out} --size {size} --seed {seed}`.
# The base recipe's pipeline (config/recipes/base.yaml: moss-fast -> sidon -> duration, parakeet,
# voiceclap, empathic-insight) on RANDOM weights in the published on-disk layouts. The audio is
# noise and every score is meaningless; VoiceCLAP's modelling code is ours, written from its
# published description (see FAKE_WEIGHTS.md). It exists to run the production path end to end:
#   snakemake --profile profiles/{profile} --configfile {out}/config.yaml --replace-workflow-config
# (--replace-workflow-config: without it, run from a directory holding config/config.yaml,
# Snakemake would merge that config's generator options into this one's.)
emotions: {emotions}
prompts: {prompts}
results: results
takes: 4  # raise for a benchmark, e.g. --config takes=64
seed: 1234
max_words: 80
device: {device}
flac_subtype: PCM_24
weights_root: {weights_root}  # the model paths below are relative to it

models:
  generator:
    backend: moss-fast  # moss-hf loads the same directory once --moss-code copied its code in
    options:
      model_dir: {model_dir}
      codec_dir: {codec_dir}
      frames_per_word: 6.0
      instruction: "extremely {{emotion_words}}. {{description}}"  # as config/recipes/base.yaml
{generator_options}    runtime: {generator_runtime}
  restorer:
    backend: sidon
    options:
      w2v_bert_dir: {w2v_bert_dir}
      adapter_dir: {adapter_dir}
      decoder_path: {decoder_path}
    runtime: {restorer_runtime}
  scorers:
    - backend: duration
    - backend: parakeet
      options:
        model_path: {parakeet_path}
      runtime: {parakeet_runtime}
    - backend: voiceclap
      options:
{voiceclap_options}      runtime: {scorer_runtime}
    - backend: empathic-insight
      options:
        encoder_path: {encoder_path}
        heads_path: {heads_path}
      runtime: {scorer_runtime}
    - backend: wavlm-speaker
      options:
        model_path: {speaker_path}
    # optional audio quality (Audiobox Aesthetics: aes_ce, aes_cu, aes_pc, aes_pq):
    # - backend: audiobox-aesthetics
    #   options:
    #     model_path: {audiobox_path}

runtime:
  queue_depth: {queue_depth}
  idle_timeout_s: {idle_timeout_s}
  start_timeout_s: {start_timeout_s}

selection:
  # Random weights never transcribe a prompt right (WER near 1), so production's
  # "wer <= 0.1" would reject every take, and their stop head often runs a take to the frame
  # budget. This filter asks only for audio (no empty take), which random weights satisfy (no
  # speaker floor: the "angry" emotion has no reference voice, and bestofn check refuses a
  # spk_sim gate there); the score and held-out scorer are the recipes', over the same columns.
  filter: "n_frames > 0"
  score: "1.5 * norm(ei_target) + norm(vc_blend) + norm(vc_genuineness)"
  held_out: [vc_prompt_sim]
  # A named reward on per-emotion scales and ei_spec (config/README.md, Named rewards and
  # scales): its top 2 per group, beside the default's pick.
  rewards:
    emo:
      score: "1.5 * z(ei_spec, emotion) + z(vc_blend, emotion) + z(vc_genuineness, emotion)"
      top: 2
"""

README = """\
# Random-weight test models (`bestofn fake-weights`, size {size}, seed {seed})

Every production backend's checkpoint, in the on-disk layout of the published one, with RANDOM
weights: the real loading code runs on them, and the audio and scores they make are noise.
`config.yaml` is a complete production config pointing here (weights_root: this folder; the
model paths relative to it, in the layout of `bestofn weights fetch`).

- `MOSS-TTS-Local-Transformer-v1.5/` (moss-fast; moss-hf{moss_hf}): the published layout:
  config.json, a stand-in tokenizer ({tokenizer}), processor_config.json,
  safetensors{shards}. Stop probability per frame: {p_stop}.
- `MOSS-Audio-Tokenizer-v2/` (the codec of MOSS-TTS-Local): the published v2 layout (config.json
  with the v2 module list + F32 safetensors under the published key names), read by our own
  implementation (`bestofn.moss.codec.tokenizer`); real size is the published 2.1 B architecture.
- `MOSS-Audio-Tokenizer/`: the 24 kHz codec of MOSS-TTS Delay (32 quantizers) in the published
  layout (config.json + safetensors), read by our own implementation
  (`bestofn.moss.codec.tokenizer`); the published remote code loads it too.
- `w2v-bert-2.0/`, `sidon_raw_weight/` (sidon): w2v-BERT 2.0 ({w2v_layers} layers), a peft LoRA
  adapter, the DAC decoder state dict (weight norm).
- `parakeet-tdt-0.6b-v3/` (parakeet): a FastConformer-TDT `.nemo` with a tokenizer trained on
  random words.
- `parakeet-tdt-0.6b-v3-CALIBRATED/`: a **CALIBRATION**, not a model: the same weights with the
  joint's output biases set so that greedy decoding emits speech's token rate (its
  CALIBRATION.md). `config.yaml` points at the {parakeet} one.
- `voiceclap-commercial/`, `voiceclap-heads/` (voiceclap): the published file set (config.json
  `voiceclap-small`, remote code, model.safetensors, Whisper feature extractor, BERT tokenizer
  with a made-up vocabulary); the remote code is OURS, written from the published description
  (the towers' key names and the audio projection's width are unknown), and the two heads in
  the published format.
- `BUD-E-Whisper/`, `Empathic-Insight-Voice-Plus/` (empathic-insight): a Whisper checkpoint and
  {n_heads} head files `model_<Name>_best.pth`.
- `moss-tts-local-transformer-4.55b-voice-acting/`{va_delay} (config/recipes/): LAION's
  voice-acting fine-tunes, ASSUMED in their base's published layout and config.json (neither
  fine-tune's config.json was found in a public source); {va_how}.
- `wavlm-base-plus-sv/` (wavlm-speaker): a WavLMForXVector checkpoint (config.json,
  preprocessor_config.json, model.safetensors).
- `audiobox-aesthetics/` (audiobox-aesthetics, optional: commented out in `config.yaml`):
  config.json (the model's fields, made-up target_transform) + model.safetensors under the
  published tensor names (WavLM-Base encoder, four axis heads).
{delay}"""
DELAY_README = """\
- `MOSS-TTS-Delay-v1.5/` (moss-fast picks its Delay engine from config.json; moss-hf{moss_hf}):
  the published Delay layout (language_model.*, emb_ext.*, lm_heads.*), Qwen3-8B shape at real
  size, 32 codebooks (of 1024 real, 64 tiny) as `MOSS-Audio-Tokenizer/` decodes them; a
  stand-in tokenizer (bytes tiny, GPT-2's BPE real) with the MOSS specials at their published
  ids (151643..151662) and a Qwen-style chat template. Point the generator's `model_dir` and
  `codec_dir` here to run it.
"""


def _yaml(value, root: Path | None = None) -> str:
    """A YAML scalar: a JSON string or number is one. A path under ``root``: relative to it."""
    if root is not None and isinstance(value, (str, Path)) and Path(value).is_relative_to(root):
        value = Path(value).relative_to(root)
    return json.dumps(str(value) if isinstance(value, Path) else value)


def _check_free_space(out: Path, size: str, delay: bool = True) -> None:
    probe = out
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    need = NEED_BYTES[size] + (DELAY_BYTES[size] if delay else 0)
    if free < need:
        raise OSError(
            f"fake-weights: {size} size needs about {need / 2**30:.1f} GiB free "
            f"under {probe}, only {free / 2**30:.1f} GiB are; nothing was written"
        )


def write_reference_voice(path: Path) -> Path:
    """The repository's reference voice when this is a source checkout, else a synthetic one
    (2 s of a voiced-speech-like harmonic tone with a syllable envelope, 24 kHz)."""
    if REFERENCE_VOICE.is_file():
        shutil.copyfile(REFERENCE_VOICE, path)
        return path
    import numpy as np
    import soundfile as sf

    sr = 24000
    t = np.arange(2 * sr) / sr
    f0 = 140 + 20 * np.sin(2 * np.pi * 0.5 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = np.clip(np.sin(2 * np.pi * 3 * t), 0, None)
    sf.write(path, (0.2 * voiced * envelope).astype(np.float32), sr, subtype="PCM_16")
    return path


# The generator's writers, first in a serial write: the command's MOSS options (--moss-code,
# --p-stop, --no-delay) shape them, so they are called here by name (see _write_backend).
MOSS_WRITERS = ("moss-tts-local + codec", "moss-audio-tokenizer", "moss-tts-delay")


@functools.cache
def fake_modules() -> dict[str, str]:
    """Backend name -> the module of this package that writes its published checkpoint: each
    declares ``FAKE_WEIGHTS = "<backend>"`` and ``write(out_dir, size, seed)``, which returns
    the backend's config options (found by reading the modules' text, ``bestofn.util.declared``)."""
    found = declarations(Path(__file__).parent, __package__, ("FAKE_WEIGHTS",))["FAKE_WEIGHTS"]
    return {backend: module for module, backend in found}


def writers() -> tuple[str, ...]:
    """Every writer, in the order a serial write runs them: the generator's, then one per
    backend with a fake (``fake_modules``), by module name."""
    return MOSS_WRITERS + tuple(fake_modules())


# LAION's voice-acting fine-tunes (config/recipes/), in the folders `bestofn weights fetch`
# lays them out in, written after the base checkpoints. Their config.json files were not found
# in any public source: these ASSUME the base checkpoints' published config.json and layout
# (the model cards name the base architecture, its codec and a LoRA merged into the weights;
# docs/notes/recipes.md). Tiny: other random weights (seed + 1); real: hard links to the base
# files (the same bytes; a real-size run measures speed, and the disk holds one copy).
LOCAL_VOICE_ACTING = "moss-tts-local-transformer-4.55b-voice-acting"
DELAY_VOICE_ACTING = "moss-tts-v1.5-8b-voice-acting"


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _link_tree(src: Path, dst: Path) -> None:
    """``dst`` with every file of ``src`` hard-linked (copied where links fail)."""
    for path in sorted(src.rglob("*")):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)


def write_voice_acting(out: Path, size, seed, moss_code, delay_code, p_stop, delay) -> None:
    """The two voice-acting fine-tunes' folders (see LOCAL_VOICE_ACTING), after the base ones."""
    from bestofn.fakes import moss, moss_delay

    if size == "real":
        _link_tree(out / "MOSS-TTS-Local-Transformer-v1.5", out / LOCAL_VOICE_ACTING)
        if delay:
            _link_tree(out / "MOSS-TTS-Delay-v1.5", out / DELAY_VOICE_ACTING)
        return
    model_dir = moss.write_model(out / LOCAL_VOICE_ACTING, size, seed + 1,
                                 out / "MOSS-Audio-Tokenizer-v2", p_stop)  # fmt: skip
    if moss_code:
        moss.add_remote_code(model_dir, moss_code)
    if delay:
        model_dir = moss_delay.write_model(out / DELAY_VOICE_ACTING, size, seed + 1,
                                           out / "MOSS-Audio-Tokenizer")  # fmt: skip
        if delay_code:
            moss_delay.add_remote_code(model_dir, delay_code)


def _write_backend(name, out, size, seed, moss_code, delay_code, p_stop):
    """Write one backend's checkpoint under ``out``: (its config options, seconds). A
    module-level function so that a worker process can run it."""
    from bestofn.fakes import moss, moss_audio_tokenizer, moss_delay

    out = Path(out)
    moss_writers = {
        "moss-tts-local + codec": lambda: moss.write(out, size, seed, moss_code, p_stop),
        "moss-audio-tokenizer": lambda: moss_audio_tokenizer.write(
            out / "MOSS-Audio-Tokenizer", size, seed
        ),
        "moss-tts-delay": lambda: moss_delay.write(out, size, seed, delay_code),
    }
    t0 = time.perf_counter()
    if name in moss_writers:
        options = moss_writers[name]()
    else:
        options = importlib.import_module(fake_modules()[name]).write(out, size, seed)
    return options, time.perf_counter() - t0


def write_all(
    out_dir,
    size: str = "tiny",
    seed: int = 0,
    moss_code=None,
    log=print,
    p_stop=None,
    delay: bool = True,
    parakeet_variant: str = "plain",
    jobs: int = 1,
) -> Path:
    """Write every production backend's random checkpoint, the sheets and ``config.yaml`` into
    ``out_dir``; returns the config's path. ``p_stop``: MOSS stop probability per frame
    (default ``moss.P_STOP[size]``). ``moss_code``: a copy of moss_tts_local_v1.5/ or of
    moss_tts_delay/, or a list of both. ``delay``: also write MOSS-TTS-Delay-v1.5/.
    ``parakeet_variant``: the Parakeet the config points at (plain | calibrated). ``jobs``:
    backends written at once, each in its own process (the same bytes as one at a time)."""
    from bestofn.fakes import empathic, moss, moss_delay, sidon

    check_size(size)
    if parakeet_variant not in ("plain", "calibrated"):
        raise ValueError(
            f"fake-weights: --parakeet must be plain or calibrated, got {parakeet_variant!r}"
        )
    calibrated = parakeet_variant == "calibrated"
    out = Path(out_dir).expanduser().resolve()
    codes = [moss_code] if isinstance(moss_code, (str, Path)) else list(moss_code or [])
    for code in codes:
        if not (Path(code) / "modeling_moss_tts.py").is_file():
            raise FileNotFoundError(
                f"fake-weights: --moss-code {code} has no modeling_moss_tts.py (expected a copy "
                "of OpenMOSS/MOSS-TTS moss_tts_local_v1.5/ or moss_tts_delay/)"
            )
    delay_code = next((c for c in codes if moss_delay.is_delay_code(c)), None)
    moss_code = next((c for c in codes if not moss_delay.is_delay_code(c)), None)
    _check_free_space(out, size, delay)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in writers() if delay or n != "moss-tts-delay"]
    job = (str(out), size, seed, moss_code and str(moss_code), delay_code and str(delay_code),
           p_stop)  # fmt: skip
    opts = {}
    if jobs <= 1:
        for name in names:
            opts[name], seconds = _write_backend(name, *job)
            log(f"fake-weights: {name} written in {seconds:.1f} s")
    else:
        # Processes, not threads: several writers seed torch's global generator, and each
        # writer's bytes must not depend on the others (the same bytes as one after another:
        # tested). Spawned, so no child inherits a forked OpenMP or torch thread state.
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        threads = max(1, (os.cpu_count() or 1) // jobs)
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_set_threads,
                                 initargs=(threads,)) as pool:  # fmt: skip
            futures = {pool.submit(_write_backend, name, *job): name for name in names}
            for future in as_completed(futures):
                opts[futures[future]], seconds = future.result()
                log(f"fake-weights: {futures[future]} written in {seconds:.1f} s")

    t0 = time.perf_counter()
    write_voice_acting(out, size, seed, moss_code, delay_code, p_stop, delay)
    log(f"fake-weights: voice-acting fine-tunes written in {time.perf_counter() - t0:.1f} s")
    reference = write_reference_voice(out / "joe_reference.flac")
    for path, rows in ((out / "emotions.tsv", EMOTIONS), (out / "prompts.tsv", PROMPTS)):
        lines = ["\t".join(c.format(reference=reference) for c in row) for row in rows]
        path.write_text("\n".join(lines) + "\n")

    vc = opts["voiceclap"]
    voiceclap_options = "".join(f"        {k}: {_yaml(v, out)}\n" for k, v in vc.items())
    (out / "config.yaml").write_text(
        CONFIG.format(
            out=out,
            size=size,
            seed=seed,
            profile="local" if size == "tiny" else "a100x8",
            emotions=_yaml(out / "emotions.tsv"),
            prompts=_yaml(out / "prompts.tsv"),
            weights_root=_yaml(out),
            model_dir=_yaml(opts["moss-tts-local + codec"]["model_dir"], out),
            codec_dir=_yaml(opts["moss-tts-local + codec"]["codec_dir"], out),
            **{k: _yaml(v, out) for k, v in opts["sidon"].items()},
            parakeet_path=_yaml(
                opts["parakeet"]["calibrated_model_path" if calibrated else "model_path"], out
            ),
            voiceclap_options=voiceclap_options,
            **{k: _yaml(v, out) for k, v in opts["empathic-insight"].items()},
            speaker_path=_yaml(opts["wavlm-speaker"]["model_path"], out),
            audiobox_path=_yaml(opts["audiobox-aesthetics"]["model_path"], out),
            **RUN[size],
        )
    )
    emotion_heads, quality_heads = empathic.N_HEADS[size]
    (out / "FAKE_WEIGHTS.md").write_text(
        README.format(
            size=size,
            seed=seed,
            moss_hf=" too: remote code copied in" if moss_code else ": add --moss-code DIR",
            shards=" shards + model.safetensors.index.json" if size == "real" else "",
            tokenizer="GPT-2's BPE with the MOSS specials at their published ids"
            if size == "real"
            else "byte-level, MOSS specials at ids 256..262",
            p_stop=moss.P_STOP[size] if p_stop is None else p_stop,
            w2v_layers=sidon.DISK_LAYERS[size],
            n_heads=f"{emotion_heads} + {quality_heads}",
            parakeet=parakeet_variant,
            va_delay=", `moss-tts-v1.5-8b-voice-acting/`" if delay else "",
            va_how="hard links to the base files (the same bytes)"
            if size == "real"
            else "other random weights (seed + 1)",
            delay=DELAY_README.format(
                moss_hf=" too: remote code copied in" if delay_code else ": add --moss-code DIR"
            )
            if delay
            else "",
        )
    )
    return out / "config.yaml"


def resolve_jobs(value, size: str) -> int:
    """``--jobs``: a count, or ``auto``: one at a time for tiny (a second or two each), else up
    to one process per backend, each with a share of the cores."""
    if value in (None, "auto"):
        return 1 if size == "tiny" else max(1, min(len(writers()), (os.cpu_count() or 1) // 2))
    jobs = int(value)
    if jobs < 1:
        raise ValueError(f"fake-weights: --jobs must be >= 1 or auto, got {value!r}")
    return jobs


def main(args) -> int:
    """The `bestofn fake-weights` subcommand."""
    t0 = time.perf_counter()
    try:
        config = write_all(
            args.dir, args.size, args.seed, args.moss_code, p_stop=args.p_stop,
            delay=not getattr(args, "no_delay", False),
            parakeet_variant=getattr(args, "parakeet", "plain"),
            jobs=resolve_jobs(getattr(args, "jobs", "auto"), args.size),
        )  # fmt: skip
    except (OSError, ValueError) as e:
        print(f"error: {e}")
        return 2
    seconds = time.perf_counter() - t0
    print(f"fake-weights: {args.size} checkpoints in {config.parent} ({seconds:.0f} s)")
    print(f"config: {config}  (check it: bestofn check --config {config})")
    return 0
