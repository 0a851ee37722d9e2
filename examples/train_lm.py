"""Train a small transformer language model on synthetic tokens with ``instrument.auto``.

One line — ``instrument.auto(model, optimizer, dataloader=loader)`` — and every ``--every``
optimizer steps a tree shows where the steps' time went: data, forward (down to each
attention block), backward, optimizer, zero_grad, and (other); above it, samples/s,
tokens/s, TFLOP/s (MFU on a known GPU) and memory. The reports also go to a JSONL file
(``runs/train_lm.jsonl``, replaced at each run) that ``python -m instrument html`` turns
into a web page.

python examples/train_lm.py [--steps 30] [--every 10] [--device cpu|cuda] [--backward-modules]
                            [--jsonl runs/train_lm.jsonl]
(follow a run live from another terminal: python -m instrument watch runs/train_lm.jsonl)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

import instrument


class TransformerLM(nn.Module):
    """Token embedding + positional embedding → causal transformer encoder → vocabulary head."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(context, d_model)
        block = nn.TransformerEncoderLayer(
            d_model, heads, 4 * d_model, dropout=0.1, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        h = self.embed(tokens) + self.position(positions)
        mask = self.causal_mask[:length, :length]
        h = self.encoder(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))


class SyntheticTokens(torch.utils.data.Dataset[torch.Tensor]):
    """Random token sequences (deterministic per index)."""

    def __init__(self, size: int, context: int, vocab: int) -> None:
        self.size, self.context, self.vocab = size, context, vocab

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(index)
        return torch.randint(0, self.vocab, (self.context + 1,), generator=gen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backward-modules", action="store_true", help="per-module backward")
    parser.add_argument("--jsonl", type=Path, default=Path("runs/train_lm.jsonl"))
    args = parser.parse_args()
    args.jsonl.unlink(missing_ok=True)  # this run's reports only (the sink appends)

    torch.manual_seed(0)
    device = torch.device(args.device)
    vocab = 512
    model = TransformerLM(vocab, 128, args.layers, 4, args.context).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    dataset = SyntheticTokens(args.steps * args.batch, args.context, vocab)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, shuffle=True)

    handle = instrument.auto(
        model,
        optimizer,
        every=args.every,
        sinks=[instrument.sinks.Console(), instrument.sinks.JSONL(args.jsonl)],
        dataloader=loader,
        backward="modules" if args.backward_modules else True,
        flops_per_step="auto",  # counted once, on the second step: TFLOP/s and MFU
    )
    for batch in loader:
        batch = batch.to(device, non_blocking=True)
        instrument.count(samples=batch.shape[0], tokens=batch[:, :-1].numel())
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    handle.remove()
    print(f"final loss {loss.item():.3f}")
    print(f"reports saved to {args.jsonl}; see them as a web page with:")
    print(f"  python -m instrument html {args.jsonl}")


if __name__ == "__main__":
    main()
