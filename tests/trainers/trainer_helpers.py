"""Helpers for the trainer tests: a character tokenizer matching the tiny targets' 99-token vocabulary."""

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

# ids 0-3 are special, then the 95 printable ASCII characters: 99 tokens, the tiny targets' vocab_size.
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def make_char_tokenizer(chat_template: str | None = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """One token per printable ASCII character (anything else is <unk>), with a ChatML-like template."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({chr(c): len(SPECIALS) + i for i, c in enumerate(range(32, 127))})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.chat_template = chat_template
    return fast

