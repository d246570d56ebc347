"""The MOSS-TTS Delay prompt, built from a tokenizer.json (no transformers needed).

The published processor (moss_tts_delay/processing_moss_tts.py, generation mode) renders one
user message through the chat template and tokenizes the whole string at once:

  <|im_start|>user\\n<user_inst>\\n- Reference(s):\\n{None | [S1]:\\n<audio block>}
  \\n- Instruction:\\n...\\n- Text:\\n{text}\\n</user_inst><|im_end|>\\n<|im_start|>assistant\\n

An audio block is audio_start, (T + n_vq - 1) user-slot tokens, audio_end; its rows carry the
reference codes in the delay pattern (codebook k shifted k rows), every other row pad codes.
Differences from the processor: the chat template is Qwen's form written out here (the
checkpoint's chat_template.jinja is not read), and the text is used as given (the processor
runs its ``normalize_tts_text`` first).
"""

from __future__ import annotations

from pathlib import Path

import torch

from bestofn.moss.delay import MossDelayConfig, apply_delay
from bestofn.moss.prompt import USER_INST_CLOSE, USER_INST_OPEN, load_tokenizer, user_inst_fields


class DelayPromptBuilder:
    def __init__(self, cfg: MossDelayConfig, encode, id_to_token):
        """encode: text (special tokens written as text) -> ids; id_to_token: id -> text."""
        self.cfg, self.encode, self.token = cfg, encode, id_to_token

    @classmethod
    def from_tokenizer_json(cls, path: str | Path, cfg: MossDelayConfig) -> DelayPromptBuilder:
        tok = load_tokenizer(path)
        return cls(cfg, lambda text: tok.encode(text, add_special_tokens=False).ids,
                   tok.id_to_token)  # fmt: skip

    def rows(
        self,
        text: str,
        *,
        language: str | None = None,
        instruction: str | None = None,
        tokens: int | None = None,
        quality: str | None = None,
        sound_event: str | None = None,
        ambient_sound: str | None = None,
        references: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The prompt as [T, 1 + n_vq] rows; references: codec codes [T_ref, n_vq] each."""
        c = self.cfg
        start, end = self.token(c.audio_start_token_id), self.token(c.audio_end_token_id)
        slot = self.token(c.audio_user_slot_token_id)
        refs = [r[:, : c.n_vq] for r in references or []]
        blocks = [f"{start}{slot * (len(r) + c.n_vq - 1)}{end}" if len(r) else f"{start}{end}"
                  for r in refs]  # fmt: skip
        reference = "\n".join(f"[S{i + 1}]:\n{b}" for i, b in enumerate(blocks)) or "None"
        fields = user_inst_fields(
            instruction=instruction, tokens=tokens, quality=quality, sound_event=sound_event,
            ambient_sound=ambient_sound, language=language,
        )  # fmt: skip
        content = f"{USER_INST_OPEN}{reference}{fields}{text}{USER_INST_CLOSE}"
        im_start, im_end = self.token(c.im_start_token_id), self.token(c.im_end_token_id)
        chat = f"{im_start}user\n{content}{im_end}\n{im_start}assistant\n"
        ids = torch.tensor(self.encode(chat), dtype=torch.long)
        rows = torch.full((len(ids), 1 + c.n_vq), c.audio_pad_code, dtype=torch.long)
        rows[:, 0] = ids
        starts = (ids == c.audio_start_token_id).nonzero()[:, 0].tolist()
        if len(starts) != len(refs):
            raise ValueError("prompt: the text itself contains audio_start tokens")
        for at, codes in zip(starts, refs, strict=True):
            if len(codes):
                delayed = apply_delay(codes.long(), c.audio_pad_code)
                rows[at + 1 : at + 1 + len(delayed), 1:] = delayed
        return rows
