"""K copies of a small feed-forward model as one wider model: grouped convolutions, batched
matmuls.

`GroupedModel(module)` runs K parameter vectors of `module` at once, each on its own inputs
(`forward(w, x)`: w (K, d), x (K, B, ...) -> (K, B, ...) logits) or all on the same inputs
(`forward_shared(w, x)`: x (B, ...) -> (K, B, ...)). It reads the module as the chain of
layers of an `nn.Sequential` (nested ones flattened) and runs each layer for all K copies:

- `Conv2d`: one `conv2d` with `groups=K` over the copies' channels stacked (B, K*C, H, W);
  with shared inputs the first convolution is an ordinary one with the K weights stacked as
  output channels (the input is read once);
- `Linear`: one `baddbmm` over (K, B, in); with shared inputs one matmul to K*out columns;
- `ReLU`, `MaxPool2d` and the other channel-wise layers: as they are, on the wide tensor;
- `Flatten` and the input normalisation: per sample, as in the module.

Each copy's output equals the module's on its own parameters to float tolerance (the sums of
a convolution or matmul may be taken in another order). Anything else (batch norm, dropout,
recurrent layers, a module with its own `forward`) makes `grouped_obstacle` name it, and
callers run such models one copy at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from clusterfed.models.zoo import InputNormalize

# Layers that act on each channel of each sample alone: they run unchanged on the copies'
# channels stacked side by side.
CHANNELWISE = (nn.ReLU, nn.MaxPool2d, nn.AvgPool2d, nn.Tanh, nn.Sigmoid, nn.Identity,
               nn.LeakyReLU, nn.ELU, nn.GELU)
# Layers that act on each sample alone but mix its channels or need its own layout.
PER_SAMPLE = (nn.Flatten, InputNormalize)


def _leaves(module: nn.Module) -> Iterator[nn.Module]:
    if type(module) is nn.Sequential:
        for child in module:
            yield from _leaves(child)
    else:
        yield module


def grouped_obstacle(module: nn.Module) -> str | None:
    """Why `module` cannot run as a GroupedModel, or None."""
    if any(True for _ in module.buffers()):
        return "the model has buffers (running statistics)"
    for layer in _leaves(module):
        name = type(layer).__name__
        if isinstance(layer, nn.Conv2d):
            if layer.groups != 1 or layer.padding_mode != "zeros" or isinstance(
                    layer.padding, str):
                return f"layer {name} with groups, string padding or a padding mode"
        elif isinstance(layer, nn.Flatten):
            if layer.start_dim != 1 or layer.end_dim != -1:
                return "a Flatten other than Flatten(1, -1)"
        elif isinstance(layer, nn.Dropout) and layer.p == 0:
            continue
        elif not isinstance(layer, (nn.Linear, *CHANNELWISE, *PER_SAMPLE)):
            return f"layer {name} (the grouped path knows Sequential chains of Conv2d, " \
                   f"Linear, Flatten, pooling and activations)"
    return None


# Layouts of the activations between layers.
SAMPLES = "samples"     # (K, B, ...): each copy's batch
CHANNELS = "channels"   # (B, K*C, H, W): the copies' channels stacked
SHARED = "shared"       # (B, ...): the same inputs for every copy


class GroupedModel:
    """A module's copies as one computation over stacked flat parameter vectors (K, d)."""

    def __init__(self, module: nn.Module) -> None:
        reason = grouped_obstacle(module)
        if reason is not None:
            raise ValueError(f"not groupable: {reason}")
        self.layers = [m for m in _leaves(module)
                       if not (isinstance(m, nn.Dropout | nn.Identity))]
        self.shapes = [p.shape for p in module.parameters()]
        self.sizes = [p.numel() for p in module.parameters()]
        self.size = sum(self.sizes)
        # Which of the flat vector's tensors each parametrised layer takes (weight, bias).
        position = {id(p): i for i, p in enumerate(module.parameters())}
        self.slots: list[tuple[int, int | None]] = []
        for layer in self.layers:
            if isinstance(layer, nn.Conv2d | nn.Linear):
                bias = position[id(layer.bias)] if layer.bias is not None else None
                self.slots.append((position[id(layer.weight)], bias))
            else:
                self.slots.append((-1, None))

    def pack(self, w: torch.Tensor) -> list[torch.Tensor]:
        """(K, d) stacked flat vectors -> each parameter tensor of all K copies, (K, *shape),
        contiguous: every layer's K weights are then one operand, and gradients come back
        per tensor, with no concatenation into a flat vector at every step. Always copies."""
        k = w.shape[0]
        return [p.reshape(k, *s).clone(memory_format=torch.contiguous_format)
                for p, s in zip(torch.split(w, self.sizes, dim=1), self.shapes, strict=True)]

    def unpack(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Per-tensor stacks -> (K, d) stacked flat vectors."""
        return torch.cat([t.reshape(len(t), -1) for t in tensors], dim=1)

    def forward(self, tensors: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """K copies' parameters (`pack`), (K, B, ...) inputs -> (K, B, ...) outputs, copy k
        on x[k]."""
        return self._run(tensors, x, SAMPLES)

    def forward_shared(self, tensors: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """K copies' parameters (`pack`), (B, ...) inputs -> (K, B, ...) outputs, every copy
        on x."""
        return self._run(tensors, x, SHARED)

    __call__ = forward

    def activations(self, tensors: list[torch.Tensor], x: torch.Tensor
                    ) -> Iterator[torch.Tensor]:
        """Every layer's output of `forward(tensors, x)`, in the layer's own layout."""
        layout = SAMPLES
        for layer, slot in zip(self.layers, self.slots, strict=True):
            x, layout = self._layer(layer, slot, tensors, x, layout)
            yield x

    def _run(self, tensors: list[torch.Tensor], x: torch.Tensor, layout: str) -> torch.Tensor:
        k = len(tensors[0])
        for layer, slot in zip(self.layers, self.slots, strict=True):
            x, layout = self._layer(layer, slot, tensors, x, layout)
        return to_samples(x, layout, k)

    @staticmethod
    def _layer(layer: nn.Module, slot: tuple[int, int | None], tensors: list[torch.Tensor],
               x: torch.Tensor, layout: str) -> tuple[torch.Tensor, str]:
        k = len(tensors[0])
        wi, bi = slot
        weight = tensors[wi] if wi >= 0 else None
        bias = tensors[bi] if bi is not None else None
        if isinstance(layer, nn.Conv2d):
            assert weight is not None
            return _conv(layer, weight, bias, x, layout, k)
        if isinstance(layer, nn.Linear):
            assert weight is not None
            return _linear(weight, bias, x, layout, k)
        if isinstance(layer, CHANNELWISE):
            return layer(x), layout
        return _per_sample(layer, x, layout, k)


def to_samples(x: torch.Tensor, layout: str, k: int) -> torch.Tensor:
    """Activations in any layout -> (K, B, ...)."""
    if layout == SAMPLES:
        return x
    if layout == SHARED:
        return x.expand(k, *x.shape)
    b, kc, h, w = x.shape                              # stored (B, H, W, K*C)
    return x.permute(0, 2, 3, 1).reshape(b, h, w, k, kc // k).permute(3, 0, 4, 1, 2)


def _to_channels(x: torch.Tensor, layout: str, k: int) -> torch.Tensor:
    """-> (B, K*C, H, W) in channels-last memory: pooling over many channels is several times
    faster that way on a CPU (measured: 2x2 max pool and its backward, 5x)."""
    if layout == CHANNELS:
        return x
    if layout == SHARED:
        return x.contiguous(memory_format=torch.channels_last)
    kk, b, c, h, w = x.shape
    return x.permute(1, 3, 4, 0, 2).contiguous().view(b, h, w, kk * c).permute(0, 3, 1, 2)


def _per_sample(layer: nn.Module, x: torch.Tensor, layout: str, k: int
                ) -> tuple[torch.Tensor, str]:
    if layout == SHARED:
        return layer(x), SHARED
    x = to_samples(x, layout, k)
    out = layer(x.reshape(-1, *x.shape[2:]))
    return out.reshape(k, x.shape[1], *out.shape[1:]), SAMPLES


def _conv(layer: nn.Conv2d, weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor,
          layout: str, k: int) -> tuple[torch.Tensor, str]:
    wide = weight.reshape(-1, *weight.shape[2:])       # (K*out, in, kh, kw)
    flat_bias = None if bias is None else bias.reshape(-1)
    conv: Callable[..., torch.Tensor] = F.conv2d
    options = {"stride": layer.stride, "padding": layer.padding, "dilation": layer.dilation}
    groups = 1 if layout == SHARED else k
    out = conv(_to_channels(x, layout, k), wide, flat_bias, groups=groups, **options)
    return out.contiguous(memory_format=torch.channels_last), CHANNELS


def _linear(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor, layout: str,
            k: int) -> tuple[torch.Tensor, str]:
    if layout == SHARED:                               # (B, in) @ (in, K*out)
        out = x @ weight.reshape(-1, weight.shape[2]).t()
        if bias is not None:
            out = out + bias.reshape(-1)
        return out.reshape(len(x), k, -1).transpose(0, 1), SAMPLES
    x = to_samples(x, layout, k)                       # (K, B, in)
    # W x^T, not x W^T: the weight's gradient then comes out (K, out, in) as stored, where
    # the other way round it is (K, in, out) and a transposing copy (measured: as slow as the
    # matmul itself).
    out = torch.bmm(weight, x.transpose(1, 2)).transpose(1, 2)
    return (out if bias is None else out + bias.unsqueeze(1)), SAMPLES
