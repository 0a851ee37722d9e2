"""Small real models the auto() tests and benchmarks train."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import nn

#: A model, its optimizer and one training step of it (forward, loss, backward, update,
#: zero_grad) on a fixed batch.
Step = tuple[nn.Module, torch.optim.Optimizer, Callable[[], None]]


def mlp_step(widths: tuple[int, ...], optimizer: type[torch.optim.Optimizer]) -> Step:
    """An MLP of ``Linear`` layers of ``widths`` (ReLU between them), batch 16, classes at
    the last width; seeded, so every call builds the same model and batch."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(widths[0], widths[1])]
    for n_in, n_out in itertools.pairwise(widths[1:]):
        layers += [nn.ReLU(), nn.Linear(n_in, n_out)]
    model = nn.Sequential(*layers)
    opt = optimizer(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, widths[0]), torch.randint(0, widths[-1], (16,))

    def step() -> None:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    return model, opt, step


def gpt2_step(
    vocab: int = 256, n_positions: int = 32, n_embd: int = 32, batch: int = 2, seq: int = 32,
    lr: float = 1e-4,
) -> Step:  # fmt: skip
    """A 2-layer GPT-2 (transformers, built from a config: nothing downloaded) and its step on
    a fixed batch of ``batch`` x ``seq`` token ids; seeded."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=n_positions, n_embd=n_embd, n_layer=2, n_head=2,
        eos_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    ids = torch.randint(0, vocab, (batch, seq))

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    return model, opt, step


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
