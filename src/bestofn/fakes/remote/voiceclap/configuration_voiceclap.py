"""STAND-IN VoiceCLAP configuration (random weights, written by ``bestofn.fakes.voiceclap``).

NOT laion/voiceclap-commercial's code, which is not public in any source we could read: a
dual-tower CLAP with the published shapes (Whisper-Small audio tower, MiniLM-L6 text tower,
768-d joint space) and the API the voiceclap backend relies on.
"""

from transformers import PretrainedConfig


class VoiceClapConfig(PretrainedConfig):
    model_type = "voiceclap_stand_in"

    def __init__(
        self,
        audio_tower=None,  # WhisperConfig fields of the audio encoder
        text_tower=None,  # BertConfig fields of the text encoder
        joint_dim=768,
        n_mels=80,
        chunk_length=30,  # seconds: the audio window of the feature extractor
        **kwargs,
    ):
        self.audio_tower = dict(audio_tower or {})
        self.text_tower = dict(text_tower or {})
        self.joint_dim, self.n_mels, self.chunk_length = joint_dim, n_mels, chunk_length
        super().__init__(**kwargs)
