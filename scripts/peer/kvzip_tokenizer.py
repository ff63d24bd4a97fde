"""The tokenizer KVzipPress asks for, as kvbench's qa protocol tokenizes on a model without a chat
template (the kvzip pairs of scripts/peer/kvpress_pairs.py).

KVzipPress loads `AutoTokenizer.from_pretrained(model.config.name_or_path)` itself, to encode its
repeat prompts and to find, from the chat template, the tokens before the context (not reconstructed)
and the user turn's closer. kvb-testbed ships a SentencePiece tokenizer.model only, which transformers
5 cannot turn into an AutoTokenizer, and has no chat template; without one KVzipPress would reconstruct
the BOS as part of the text, where kvbench's protocol treats it as the prefix. So the press is given
this stand-in instead: SentencePiece's encode (kvbench's tokenizer is checked equal to it), and a
"template" that is kvbench's no-template prompt, BOS + the text + "\\n", so that KVzipPress's own
parsing finds prefix = [BOS] and closer = encode("\\n"), what kvbench's qa protocol hands the method.
"""

import os

BOS_TEXT = "<s>"  # the template's BOS as text; encode() maps exactly this string to the BOS id


class SentencePieceAsAutoTokenizer:
    chat_template = BOS_TEXT + "{text}\n"

    def __init__(self, model_dir):
        import sentencepiece as spm
        self.sp = spm.SentencePieceProcessor(model_file=os.path.join(model_dir, "tokenizer.model"))

    @classmethod
    def from_pretrained(cls, model_dir, **_):
        return cls(model_dir)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, **_):
        if tokenize or len(messages) != 1 or not add_generation_prompt:
            raise ValueError("SentencePieceAsAutoTokenizer: only one untokenized user turn")
        return self.chat_template.format(text=messages[0]["content"])

    def encode(self, text, return_tensors=None, add_special_tokens=False):
        if add_special_tokens:
            raise ValueError("SentencePieceAsAutoTokenizer: no special tokens are added")
        ids = [self.sp.bos_id()] if text == BOS_TEXT else self.sp.encode(text)
        if return_tensors == "pt":
            import torch
            return torch.tensor([ids], dtype=torch.long)
        return ids


def kvzip_press(kp, ratio, plus):
    """KVzipPress (kvpress module kp) reading this stand-in instead of AutoTokenizer."""
    import kvpress.presses.kvzip_press as module
    module.AutoTokenizer = SentencePieceAsAutoTokenizer
    return kp.KVzipPress(compression_ratio=ratio, n_sink=4, chunk_size=2048,
                         kvzip_plus_normalization=plus)
