"""Config options shared by both MOSS generators (moss-hf and moss-fast), so one config can
switch engines by changing only the backend name."""

COMMON_DEFAULTS = {
    "model_dir": None,  # checkpoint dir: config.json, weights, tokenizer (+ remote code: moss-hf)
    "codec_dir": None,  # MOSS-Audio-Tokenizer-v2 directory
    "lora": None,  # optional peft LoRA adapter directory, merged once at load (cached)
    "cache_dir": None,  # merged-LoRA cache + hash memo; default ~/.cache/bestofn/moss
    "dtype": "auto",  # model weights: bfloat16 on cuda, float32 on cpu
    "codec_weight_dtype": "bf16",
    "codec_compute_dtype": "bf16",
    "batch_size": 64,  # takes per engine call
    "decode_batch_size": 16,  # takes per codec decode call
    "frames_per_word": 6.0,
    "min_frames": 25,
    "max_frames": 1500,
    # sampling: the model card's recommendation (docs/moss_tts_model_card.md)
    "do_sample": True,
    "audio_temperature": 1.7,
    "audio_top_p": 0.8,
    "audio_top_k": 25,
    "audio_repetition_penalty": 1.0,
    "text_temperature": 1.0,
    "text_top_p": 1.0,
    "text_top_k": 50,
    "language": None,  # override the tag; default from GroupSpec.language
    "instruction": "none",  # "none" | "emotion" | "emotion_description" -> template Instruction
    "max_reference_s": 30.0,  # longer reference audio is cut (prompt length = cost)
    "mono": False,  # True: average the two channels
    "hash_weights": True,  # content hashes in provenance (memoised on disk)
}
