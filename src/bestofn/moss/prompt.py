"""The MOSS-TTS-Local v1.5 prompt, built from a tokenizer.json (no transformers needed).

Same token sequence as the reference processor (processing_moss_tts.py, generation mode):
each piece is tokenized on its own, in this order, then special ids are spliced in:

  [im_start] "user\\n" "<user_inst>\\n- Reference(s):\\n" <"None" | per reference:
  [audio_start] user-slot rows with the reference codes [audio_end]> "\\n- Instruction:\\n..."
  ... "- Text:\\n" <text> "\\n</user_inst>" [im_end] "\\n" [im_start] "assistant\\n" [audio_start]
"""

from __future__ import annotations

from pathlib import Path

import torch

from bestofn.moss.config import MossLocalConfig

# ISO 639-1 -> the language tags the v1.5 template expects (clis/moss_tts_local_v1.5_app.py).
LANGUAGE_TAGS = {
    "zh": "Chinese", "yue": "Cantonese", "en": "English", "ar": "Arabic", "cs": "Czech",
    "da": "Danish", "nl": "Dutch", "fi": "Finnish", "fr": "French", "de": "German",
    "el": "Greek", "he": "Hebrew", "hi": "Hindi", "hu": "Hungarian", "it": "Italian",
    "ja": "Japanese", "ko": "Korean", "mk": "Macedonian", "ms": "Malay",
    "fa": "Persian (Farsi)", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
    "ru": "Russian", "es": "Spanish", "sw": "Swahili", "sv": "Swedish", "tl": "Tagalog",
    "th": "Thai", "tr": "Turkish", "vi": "Vietnamese",
}  # fmt: skip


def language_tag(language: str | None) -> str | None:
    """The template's tag of an ISO code (``fr`` -> ``French``; a regional code by its language:
    ``pt-BR`` -> ``Portuguese``); a name the table does not know passes as given."""
    if not language:
        return None
    key = language.lower().replace("_", "-")
    return LANGUAGE_TAGS.get(key) or LANGUAGE_TAGS.get(key.split("-")[0], language)


def _field(value) -> str:
    text = "None" if value is None else str(value).strip()
    return text or "None"


# the v1.5 user message (Local and Delay): USER_INST_OPEN, the references ("None" if none),
# user_inst_fields(...), the text, USER_INST_CLOSE
USER_INST_OPEN = "<user_inst>\n- Reference(s):\n"
USER_INST_CLOSE = "\n</user_inst>"


def user_inst_fields(
    *, instruction=None, tokens=None, quality=None, sound_event=None, ambient_sound=None,
    language=None,
) -> str:  # fmt: skip
    """The fields between the references and the text ("None" for a field not given)."""
    return (
        f"\n- Instruction:\n{_field(instruction)}\n- Tokens:\n{_field(tokens)}"
        f"\n- Quality:\n{_field(quality)}\n- Sound Event:\n{_field(sound_event)}"
        f"\n- Ambient Sound:\n{_field(ambient_sound)}\n- Language:\n{_field(language)}"
        "\n- Text:\n"
    )


def load_tokenizer(path: str | Path):
    """A ``tokenizers.Tokenizer`` from a tokenizer.json (FileNotFoundError naming the path)."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer not found: {path}")
    return Tokenizer.from_file(str(path))


class PromptRows:
    """The v1.5 user message as model input rows [T, 1 + n_vq], built from a tokenizer.json;
    an architecture says how the message becomes rows (``_rows``): Local here, Delay in
    bestofn.moss.delay_prompt."""

    def __init__(self, cfg, encode, id_to_token=None):
        """encode: text -> token ids, without special tokens; id_to_token: id -> its text."""
        self.cfg, self.encode, self.token = cfg, encode, id_to_token

    @classmethod
    def from_tokenizer_json(cls, path: str | Path, cfg):
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
        """The prompt as [T, 1 + n_vq] rows; references are codec codes [T_ref, n_vq]."""
        fields = user_inst_fields(
            instruction=instruction, tokens=tokens, quality=quality, sound_event=sound_event,
            ambient_sound=ambient_sound, language=language,
        )  # fmt: skip
        return self._rows(text, fields, list(references or []))

    def _rows(self, text: str, fields: str, references: list[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError


class PromptBuilder(PromptRows):
    """MOSS-TTS-Local: each piece tokenized on its own, references as user-slot rows."""

    def _text_rows(self, ids: list[int]) -> torch.Tensor:
        rows = torch.full((len(ids), 1 + self.cfg.n_vq), self.cfg.audio_pad_code, dtype=torch.long)
        rows[:, 0] = torch.tensor(ids, dtype=torch.long)
        return rows

    def _audio_rows(self, codes: torch.Tensor, slot: int) -> torch.Tensor:
        rows = torch.empty((codes.shape[0], 1 + self.cfg.n_vq), dtype=torch.long)
        rows[:, 0] = slot
        rows[:, 1:] = codes[:, : self.cfg.n_vq]
        return rows

    def _rows(self, text: str, fields: str, references: list[torch.Tensor]) -> torch.Tensor:
        c = self.cfg
        head = [c.im_start_token_id] + self.encode("user\n")
        head += self.encode(USER_INST_OPEN)
        tail = self.encode(fields) + self.encode(text)
        tail += self.encode(USER_INST_CLOSE) + [c.im_end_token_id] + self.encode("\n")
        tail += [c.im_start_token_id] + self.encode("assistant\n") + [c.audio_start_token_id]
        if not references:
            return self._text_rows(head + self.encode("None") + tail)
        parts = [self._text_rows(head)]
        for codes in references:
            parts.append(self._text_rows([c.audio_start_token_id]))
            parts.append(self._audio_rows(codes, c.audio_user_slot_token_id))
            parts.append(self._text_rows([c.audio_end_token_id]))
        parts.append(self._text_rows(tail))
        return torch.cat(parts)


def left_pad(prompts: list[torch.Tensor], cfg: MossLocalConfig):
    """Stack prompts [T_i, 1+n_vq] into ids [B, T, 1+n_vq] + attention mask [B, T]."""
    T = max(p.shape[0] for p in prompts)
    ids = torch.full((len(prompts), T, 1 + cfg.n_vq), cfg.audio_pad_code, dtype=torch.long)
    ids[..., 0] = cfg.pad_token_id
    mask = torch.zeros(len(prompts), T, dtype=torch.bool)
    for b, p in enumerate(prompts):
        ids[b, T - p.shape[0] :] = p
        mask[b, T - p.shape[0] :] = True
    return ids, mask
