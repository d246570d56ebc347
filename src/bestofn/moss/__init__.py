"""MOSS-TTS-Local (v1.5) inference: published checkpoint -> codes -> audio, fast.

config.py     checkpoint facts (shapes, special tokens) from config.json
model.py      the network, with static-cache prefill/decode steps
kv_cache.py   preallocated caches
sampling.py   GPU sampling with per-take counter-based random numbers
engine_shell.py  what every decode loop shares: states, CUDA graphs, the sync loop
engine.py     the Local strategy on it: batched decode, the frame step
continuous.py continuous batching (requests join a running decode) for speech
checkpoint.py read/write the published safetensors layout
prompt.py     the v1.5 prompt template
codec.py      codec interface (MOSS-Audio-Tokenizer-v2)
options.py    config options of both MOSS backends; moss-fast's kernel paths (schema)
published_draws.py  per-take draws inside the published generate loops (moss-hf)
parity.py     `bestofn parity`: moss-fast vs the reference remote code
reference_code.py  importing a copy of the published code (parity, bench)
budget.py     the pacing dial: Tokens hint + frame budget per take (shared with moss-hf)
lora.py       LoRA merge once + on-disk cache (shared with moss-hf)

MOSS-TTS v1.5 Delay (8B, 32 codebooks, 24 kHz):
delay.py          config, network, published-layout loader, delay pattern
delay_engine.py   the Delay strategy on the engine shell (delay-pattern counters)
delay_prompt.py   the Delay prompt (chat template) from tokenizer.json
delay_parity.py   `bestofn parity` against a copy of moss_tts_delay/
"""
