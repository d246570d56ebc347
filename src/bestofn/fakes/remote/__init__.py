"""Remote code written next to random weights (copied into checkpoint directories)."""
