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

import torch

from bestofn.moss.delay import apply_delay
from bestofn.moss.prompt import USER_INST_CLOSE, USER_INST_OPEN, PromptRows


class DelayPromptBuilder(PromptRows):
    """MOSS-TTS Delay: the chat string tokenized at once (needs ``id_to_token``), references
    in the delay pattern."""

    def _rows(self, text: str, fields: str, references: list[torch.Tensor]) -> torch.Tensor:
        c = self.cfg
        start, end = self.token(c.audio_start_token_id), self.token(c.audio_end_token_id)
        slot = self.token(c.audio_user_slot_token_id)
        refs = [r[:, : c.n_vq] for r in references]
        blocks = [f"{start}{slot * (len(r) + c.n_vq - 1)}{end}" if len(r) else f"{start}{end}"
                  for r in refs]  # fmt: skip
        reference = "\n".join(f"[S{i + 1}]:\n{b}" for i, b in enumerate(blocks)) or "None"
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
