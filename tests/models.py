"""Small real models the auto() tests and benchmarks train."""

from __future__ import annotations

import torch
from torch import nn


class TinyLM(nn.Module):
    """A small transformer language model: embed → encoder → head."""

    def __init__(self, vocab: int = 64, d: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        block = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


def lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token-style cross entropy of the model's logits against the tokens themselves."""
    logits = model(tokens)
    return nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
