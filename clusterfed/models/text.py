"""Recurrent models over int64 token sequences; `n_classes` is the vocabulary size.

The LSTM is written out gate by gate instead of using nn.LSTM: torch.func.vmap has no batching
rule for the fused LSTM kernel, and these models must run vectorised over stacked parameters.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from clusterfed.errors import ConfigError
from clusterfed.models.zoo import MODELS


def _sequence_length(name: str, input_shape: tuple[int, ...]) -> int:
    if len(input_shape) != 1 or input_shape[0] < 1:
        raise ConfigError(f"model {name} takes token sequences shaped (T,), got {input_shape}")
    return input_shape[0]


def _positive(name: str, **sizes: int) -> None:
    for key, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"model {name}: {key} must be a positive integer, got {value!r}")


class LSTMLayer(nn.Module):
    """One unidirectional LSTM layer over (N, T, input) -> (N, T, hidden), zero initial state.

    One bias per gate, as TensorFlow's BasicLSTMCell (LEAF's reference), so 4h(input + h + 1)
    parameters. Gate order i, f, o, g, the three sigmoid gates side by side. The forget-gate
    bias starts at 1, the constant that BasicLSTMCell adds, so that early training does not
    forget.
    """

    def __init__(self, input_size: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.ih = nn.Linear(input_size, 4 * hidden)
        self.weight_hh = nn.Parameter(torch.empty(4 * hidden, hidden))
        bound = 1.0 / math.sqrt(hidden)  # nn.LSTM's initial range
        with torch.no_grad():
            nn.init.uniform_(self.ih.weight, -bound, bound)
            nn.init.uniform_(self.weight_hh, -bound, bound)
            self.ih.bias.zero_()
            self.ih.bias[hidden:2 * hidden] = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The input projection of all steps at once; only the recurrence is sequential, and it
        # is kept to few operations because their dispatch, not arithmetic, dominates. Unbind,
        # not indexing per step: each index's backward would fill a zero tensor of all steps.
        projected = self.ih(x).unbind(1)
        w_hh = self.weight_hh.t()
        split = 3 * self.hidden
        h = x.new_zeros(x.shape[0], self.hidden)
        c = h
        outputs = []
        for step in projected:
            gates = torch.addmm(step, h, w_hh)
            i, f, o = torch.sigmoid(gates[:, :split]).chunk(3, dim=-1)
            c = f * c + i * torch.tanh(gates[:, split:])
            h = o * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs, dim=1)


class LSTMStack(nn.Sequential):
    """`layers` LSTM layers, each feeding its hidden sequence to the next."""

    def __init__(self, input_size: int, hidden: int, layers: int) -> None:
        super().__init__(*[LSTMLayer(input_size if k == 0 else hidden, hidden)
                           for k in range(layers)])


class TokenLSTM(nn.Module):
    """Embedding, stacked LSTM, linear decoder over the vocabulary.

    With `every_step`, (N, T) int64 -> (N, vocab, T) logits, a prediction per position with the
    class dimension second, the layout F.cross_entropy wants for (N, T) targets. Otherwise
    (N, T) -> (N, vocab), predicting the token after the sequence from the last step.
    """

    def __init__(self, vocab: int, embed_dim: int, hidden: int, layers: int,
                 every_step: bool) -> None:
        super().__init__()
        self.every_step = every_step
        self.embedding = nn.Embedding(vocab, embed_dim)
        self.lstm = LSTMStack(embed_dim, hidden, layers)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states = self.lstm(self.embedding(tokens))
        if self.every_step:
            return self.decoder(states).transpose(1, 2)
        return self.decoder(states[:, -1])


@MODELS.register("lstm_lm")
def lstm_lm(input_shape: tuple[int, ...], n_classes: int, embed_dim: int = 128,
            hidden: int = 256, layers: int = 2) -> nn.Module:
    """CFL's two-layer LSTM language model for AG News (cfl.md §4.4; sizes from ambiguity A13).

    Embedding 128, 2 LSTM layers of 256, untied linear decoder over the vocabulary (A13 allows
    either; tying would force embed_dim == hidden). Input (N, T) tokens (A13: BPTT length 35),
    output (N, vocab, T). Parameters at A13's top-10k vocabulary: 4,769,552.
    """
    _sequence_length("lstm_lm", input_shape)
    _positive("lstm_lm", n_classes=n_classes, embed_dim=embed_dim, hidden=hidden, layers=layers)
    return TokenLSTM(n_classes, embed_dim, hidden, layers, every_step=True)


@MODELS.register("char_lstm")
def char_lstm(input_shape: tuple[int, ...], n_classes: int, embed_dim: int = 8,
              hidden: int = 256, layers: int = 2) -> nn.Module:
    """LEAF's Shakespeare model (`models/shakespeare/stacked_lstm.py` of LEAF).

    Embedding 8, two LSTM layers of 256, linear from the last step's output to the vocabulary.
    Input (N, 80) characters, output (N, vocab) logits for the next one. Parameters with LEAF's
    80 characters: 817,872, as LEAF's TensorFlow model (nn.LSTM's second bias would add 2,048).
    """
    _sequence_length("char_lstm", input_shape)
    _positive("char_lstm", n_classes=n_classes, embed_dim=embed_dim, hidden=hidden,
              layers=layers)
    return TokenLSTM(n_classes, embed_dim, hidden, layers, every_step=False)
