"""The MOSS audio tokenizer (codec): config, checkpoint, layers, kernels, the
batch and streaming decode."""
