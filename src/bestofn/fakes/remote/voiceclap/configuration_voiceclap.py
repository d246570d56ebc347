"""VoiceCLAP-small configuration, written from the published description of
laion/voiceclap-commercial (random weights, written by ``bestofn.fakes.voiceclap``).

The published ``configuration_voiceclap.py`` is not in any public source we could read: the
field names below are the ones the published config.json is described with (``model_type:
voiceclap-small``, ``n_state``, ``n_layer``, ``text_*``, ``embed_dim``); the rest are ours and
are named in docs/notes/scorers-facts.md.
"""

from transformers import PretrainedConfig


class VoiceClapConfig(PretrainedConfig):
    model_type = "voiceclap-small"

    def __init__(
        self,
        n_mels=80,
        n_ctx=1500,  # encoder positions of one 30-s chunk
        n_state=768,
        n_head=12,
        n_layer=12,
        text_vocab_size=30522,
        text_hidden_size=384,
        text_num_layers=6,
        text_num_heads=12,
        text_intermediate_size=1536,
        text_max_positions=512,
        text_proj_hidden=576,
        audio_proj_hidden=768,  # UNKNOWN in the published model: our choice
        embed_dim=768,
        sample_rate=16000,
        chunk_seconds=30,
        **kwargs,
    ):
        self.n_mels, self.n_ctx, self.n_state, self.n_head, self.n_layer = (
            n_mels, n_ctx, n_state, n_head, n_layer
        )  # fmt: skip
        self.text_vocab_size, self.text_hidden_size = text_vocab_size, text_hidden_size
        self.text_num_layers, self.text_num_heads = text_num_layers, text_num_heads
        self.text_intermediate_size, self.text_max_positions = (
            text_intermediate_size, text_max_positions
        )  # fmt: skip
        self.text_proj_hidden, self.audio_proj_hidden = text_proj_hidden, audio_proj_hidden
        self.embed_dim, self.sample_rate, self.chunk_seconds = embed_dim, sample_rate, chunk_seconds
        super().__init__(**kwargs)
