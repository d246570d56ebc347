"""STAND-IN remote code for VoiceCLAP (random weights, written by bestofn.fakes)."""
