"""Our VoiceCLAP remote code, written from the published description (random weights, written
by bestofn.fakes.voiceclap)."""
