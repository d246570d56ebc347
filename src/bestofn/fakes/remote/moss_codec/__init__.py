"""STAND-IN remote code for MOSS-Audio-Tokenizer-v2 (random weights, written by bestofn.fakes)."""
