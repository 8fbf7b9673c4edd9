"""Block scoring kernels for the chunked scorer (W1 s_ij = d (W1 diag(v_i)) t_j, paper appendix D).

`AdapterKernel` evaluates a VariationalSimilarityAdapter at inference on a block of pairs with one
large 2-D GEMM per layer, the block's pairs stacked as the rows of each activation matrix, so the
work runs near the machine's matmul rate and no (pairs, d) similarity tensor exists:

    first layer   W1 s_ij = d (W1 diag(v_i)) t_j: items (Nc, d+1) @ prepared queries^T
                  (d+1, Bq*H') = (Nc, Bq*H') == (Nc*Bq pairs, H'), in place relu
    fc2 (folded)  (P, H') @ (H', O'): per component the decoder's hidden pre-activations (its first
                  Linear composed with the mu rows, exact since z = mu at inference), the logvar
                  rows, the mixture logit
    tail          decoder remainder (block-diagonal over components), the logvar bound and its
                  L-mean (the bound is not linear, so it cannot be folded into fc2), softmax,
                  sigma_hat

H' = H + 1 (+ zero padding): the extra unit is constantly 1 and carries the fc2 bias.
`GenericKernel` wraps any head with `score_block(queries, items) -> (logits, sigma_hat | None)`.
"""
from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

from vacsr.model.adapter import VariationalSimilarityAdapter
from vacsr.threads import torch_threads

_FP32 = 4


class AdapterKernel:
    """Inference-only, layout-optimised copy of a VariationalSimilarityAdapter's weights.

    Biases ride inside the GEMMs, so no separate pass over the large activations adds them: items
    get a ones column (first-layer bias) and the hidden layer an extra unit that is always 1
    (zero weights, bias 1, relu(1) = 1) whose fc2 column is the fc2 bias.
    """

    def __init__(self, head: VariationalSimilarityAdapter, device: torch.device,
                 dtype: torch.dtype):
        self.device, self.dtype = torch.device(device), dtype
        self.k, self.latent = head.num_components, head.latent_dim
        self.bounded = head.bounded_sigma
        self.logvar_bound = head.logvar_bound
        first, rest = self._split_decoder(head.decoder)
        self.dec_hidden = first.out_features
        with torch.no_grad():
            w1 = head.fc1.weight.double() * head.scale  # (H, d); the d factor of s_ij folded in
            w1 = torch.cat([w1, head.fc1.bias.double()[:, None]], 1)  # (H, d+1) bias column
            unit = torch.zeros(1, w1.shape[1], dtype=torch.float64)
            unit[0, -1] = 1.0  # the always-one hidden unit
            w1 = torch.cat([w1, unit])  # (H+1, d+1)
            w2 = self._fold_second_layer(head, first)  # (O', H+1)
            # Zero padding to multiples of 16 output columns: MKL runs these GEMMs markedly faster
            # at aligned widths (measured here: fc2 133 -> 144 columns ~1.3x, first layer of the
            # pair kernel 513 -> 528 ~1.5x). Padded hidden units have zero weights and bias, so
            # they stay 0 after the relu, and zero fc2 columns.
            pad_hidden = (-w1.shape[0]) % 16
            w1 = torch.cat([w1, w1.new_zeros(pad_hidden, w1.shape[1])])  # (H', d+1)
            w2 = torch.cat([w2, w2.new_zeros(w2.shape[0], pad_hidden)], 1)  # (O', H')
            w2 = torch.cat([w2, w2.new_zeros((-w2.shape[0]) % 16, w2.shape[1])])  # (O'', H')
            self.rest = [self._block_diagonal(layer) if isinstance(layer, nn.Linear) else None
                         for layer in rest]  # None marks a ReLU
        self.hidden = w1.shape[0]  # H' = H + 1 (+ padding)
        self.w1_fp32 = w1.to(self.device, torch.float32)  # queries are prepared in fp32
        self.w1 = w1.to(self.device, dtype)
        self.w2 = w2.to(self.device, dtype)

    @staticmethod
    def supports(head: nn.Module) -> bool:
        if not isinstance(head, VariationalSimilarityAdapter):
            return False
        layers = list(head.decoder) if isinstance(head.decoder, nn.Sequential) else [head.decoder]
        return (isinstance(layers[0], nn.Linear)
                and all(isinstance(m, (nn.Linear, nn.ReLU)) for m in layers))

    @staticmethod
    def _split_decoder(decoder: nn.Module):
        layers = list(decoder) if isinstance(decoder, nn.Sequential) else [decoder]
        return layers[0], layers[1:]

    def _fold_second_layer(self, head, first: nn.Linear) -> torch.Tensor:
        """(O', H+1) rows [dec pre-acts (K*Dh) | logvar (K*L) | mix logits (K)], bias last."""
        k, latent = head.num_components, head.latent_dim
        # fc2 with its bias as the last column: (K(2L+1), H+1)
        w2 = torch.cat([head.fc2.weight.double(), head.fc2.bias.double()[:, None]], 1)
        wd, bd = first.weight.double(), first.bias.double()  # (Dh, L), (Dh,)
        rows = []
        for c in range(k):  # decoder's first Linear composed with the mu rows of component c
            block = wd @ w2[c * latent:(c + 1) * latent]  # (Dh, H+1)
            block[:, -1] += bd
            rows.append(block)
        rows.append(w2[k * latent:2 * k * latent])  # (K*L, H+1) logvar rows
        rows.append(w2[2 * k * latent:])  # (K, H+1) mixture logits
        return torch.cat(rows)

    def _block_diagonal(self, layer: nn.Linear):
        """A decoder Linear applied to all K components at once: (K*out, K*in) weight, (K*out,)
        bias."""
        weight = torch.block_diag(*[layer.weight.detach().float()] * self.k)
        bias = layer.bias.detach().float().repeat(self.k)
        return weight.to(self.device), bias.to(self.device)

    # ------------------------------------------------------------ memory model
    def _element(self) -> int:
        return torch.finfo(self.dtype).bits // 8

    def bytes_per_pair(self) -> int:
        """Transient bytes per pair of a block: first-layer activations, fc2 output, tail rows."""
        rows = self.w2.shape[0]
        return self._element() * (self.hidden + rows) + _FP32 * (rows + 6 * self.k + 4)

    def bytes_per_query(self) -> int:
        # prepared block + fp32 temp
        return self._element() * self.w1.numel() + _FP32 * self.w1.numel()

    def bytes_per_item(self) -> int:
        return self._element() * self.w1.shape[1]  # augmented item row

    # ------------------------------------------------------------ blocks
    def prepare_queries(self, queries: torch.Tensor) -> torch.Tensor:
        """queries (Bq, d) -> (Bq*H', d+1): row b*H' + h = [W1'[h] * v_b, bias'[h]]."""
        q = queries.to(self.device, torch.float32)
        with elementwise_threads(self.device):
            prepared = torch.empty(q.shape[0], self.hidden, q.shape[1] + 1, device=self.device)
            # each query times every first-layer row: (Bq, H', d)
            torch.mul(q[:, None, :], self.w1_fp32[None, :, :-1], out=prepared[:, :, :-1])
            prepared[:, :, -1] = self.w1_fp32[None, :, -1]  # bias column
            return prepared.view(-1, q.shape[1] + 1).to(self.dtype)

    def prepare_items(self, items: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """items (Nc, d) -> (Nc, d+1) with a ones column that carries the first-layer bias."""
        rows = items.shape[0]
        if out is None or out.shape[0] < rows:
            out = torch.empty(rows, items.shape[1] + 1, device=self.device, dtype=self.dtype)
        out = out[:rows]
        with elementwise_threads(self.device):
            out[:, :-1].copy_(items)
            out[:, -1] = 1
        return out

    def dense_block(self, prepared_queries: torch.Tensor, prepared_items: torch.Tensor,
                    workspace: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """All pairs of Bq prepared queries x Nc prepared items -> logits, sigma_hat (Bq, Nc)
        float32.

        Pairs are rows, item-major: row n*Bq + b is pair (query b, item n)."""
        num_q = prepared_queries.shape[0] // self.hidden
        num_g = prepared_items.shape[0]
        pre = _buffer(workspace, "pre", (num_g, prepared_queries.shape[0]), self.dtype, self.device)
        torch.mm(prepared_items, prepared_queries.T, out=pre)  # (Nc, Bq*H') == (Nc*Bq, H')
        logits, sigma = self._tail(pre.view(-1, self.hidden), workspace)  # (Nc*Bq,)
        return logits.view(num_g, num_q).T, sigma.view(num_g, num_q).T

    def pair_block(self, queries: torch.Tensor, items: torch.Tensor, query_index: torch.Tensor,
                   item_index: torch.Tensor, workspace: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Listed pairs (query_index[p], item_index[p]) of queries (N_q, d), items (N_g, d), both on
        the device -> logits, sigma_hat (P,) float32.

        An irregular pair list has no shared operand to fold into the weights, so the Hadamard
        products are formed explicitly, one chunk at a time ((P, d+1), smaller than the chunk's
        first-layer output), into reused buffers: still one GEMM per layer."""
        num, dim = len(query_index), queries.shape[1]
        sim = _buffer(workspace, "sim", (num, dim + 1), self.dtype, self.device)
        gathered_q = _buffer(workspace, "gather_q", (num, dim), torch.float32, self.device)
        gathered_g = _buffer(workspace, "gather_g", (num, dim), torch.float32, self.device)
        with elementwise_threads(self.device):  # memory-bound gathers and product
            torch.index_select(queries, 0, query_index, out=gathered_q)
            torch.index_select(items, 0, item_index, out=gathered_g)
            if self.dtype == torch.float32:
                torch.mul(gathered_q, gathered_g, out=sim[:, :-1])
            else:  # the product in fp32, rounded once to the GEMM dtype
                sim[:, :-1].copy_(gathered_q.mul_(gathered_g))
            sim[:, -1] = 1
        pre = _buffer(workspace, "pre", (num, self.hidden), self.dtype, self.device)
        torch.mm(sim, self.w1.T, out=pre)  # (P, H')
        return self._tail(pre, workspace)

    def _tail(self, pre: torch.Tensor, workspace: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """First-layer pre-activations (P, H') -> logits, sigma_hat (P,) float32."""
        with elementwise_threads(self.device):
            pre.relu_()  # in place: the activations are not needed again
        out = _buffer(workspace, "fc2", (pre.shape[0], self.w2.shape[0]), self.dtype, self.device)
        torch.mm(pre, self.w2.T, out=out)  # (P, O'), biases included
        k, kd = self.k, self.k * self.dec_hidden
        with elementwise_threads(self.device):
            rows = out[:, :kd].float()  # (P, K*Dh) decoder hidden pre-activations, all components
            for layer in self.rest:
                rows = rows.relu_() if layer is None else torch.addmm(layer[1], rows, layer[0].T)
            kl = k * self.latent
            bound = self.logvar_bound  # the adapter's smooth bound, then the mean over L
            logvar = out[:, kd:kd + kl].float().div_(bound).tanh_().mul_(bound)  # (P, K*L)
            pooled = logvar.view(-1, k, self.latent).mean(dim=2)  # (P, K)
            return self._mix(rows, pooled, out[:, kd + kl:kd + kl + k].float())

    def _mix(self, component_logits, pooled_logvar, mix_logits):
        """(P, K) each -> logit m = sum_k alpha_k m_k and sigma_hat (P,); a loop over the few
        components (reductions over a short trailing dim are slow on CPU)."""
        top = mix_logits.max(dim=1).values  # (P,)
        weights = [torch.exp(mix_logits[:, c] - top) for c in range(self.k)]
        total = weights[0].clone()
        logits, pooled = weights[0] * component_logits[:, 0], weights[0] * pooled_logvar[:, 0]
        for c in range(1, self.k):
            total += weights[c]
            logits.addcmul_(weights[c], component_logits[:, c])
            pooled.addcmul_(weights[c], pooled_logvar[:, c])
        logits /= total
        pooled /= total
        return logits, torch.sigmoid(pooled) if self.bounded else torch.exp(pooled)


class GenericKernel:
    """Any head exposing score_block(queries, items) -> (logits, sigma_hat or None)."""

    def __init__(self, head: nn.Module, device: torch.device, bytes_per_pair: int = 64):
        self.head = copy.deepcopy(head).to(device).eval()  # the caller's module stays where it is
        self.device = torch.device(device)
        self._bytes_per_pair = bytes_per_pair

    def bytes_per_pair(self) -> int:
        return self._bytes_per_pair

    def bytes_per_query(self) -> int:
        return 0

    def bytes_per_item(self) -> int:
        return 0

    def prepare_queries(self, queries):
        return queries.to(self.device, torch.float32)

    def prepare_items(self, items, out=None):
        return items.to(self.device, torch.float32)

    @torch.no_grad()
    def dense_block(self, prepared_queries, prepared_items, workspace):
        logits, sigma = self.head.score_block(prepared_queries, prepared_items)
        return logits.float(), None if sigma is None else sigma.float()

    @torch.no_grad()
    def pair_block(self, queries, items, query_index, item_index, workspace):
        # score_block only scores all pairs of two sets: take the diagonal of small blocks (row i
        # pairs with row i), trading 64x redundant work for one call per 64 pairs.
        queries, items = queries.index_select(0, query_index), items.index_select(0, item_index)
        logits, sigma = [], []
        for start in range(0, queries.shape[0], 64):
            q = queries[start:start + 64].to(self.device)
            g = items[start:start + 64].to(self.device)
            block_logits, block_sigma = self.head.score_block(q, g)
            logits.append(block_logits.diagonal().float())
            sigma.append(None if block_sigma is None else block_sigma.diagonal().float())
        sigma_out = None if sigma[0] is None else torch.cat(sigma)
        return torch.cat(logits), sigma_out


@contextlib.contextmanager
def elementwise_threads(device: torch.device):
    """Run memory-bound elementwise work single-threaded on CPU.

    On a loaded machine every multi-threaded op waits for its slowest thread's next time slice
    (milliseconds), however small the op; the GEMMs are long enough to amortise that, the
    elementwise passes between them are not, and one thread streams them nearly as fast.
    torch's thread count is process-wide: it is restored on exit, but do not score while another
    Python thread of the same process runs CPU torch work."""
    if device.type != "cpu":
        yield
        return
    with torch_threads(1):
        yield


def build_kernel(head: nn.Module, device, dtype: torch.dtype):
    """The fast adapter kernel when the head is a supported VACSR adapter, else the generic one."""
    if AdapterKernel.supports(head):
        return AdapterKernel(head, device, dtype)
    return GenericKernel(head, device)


def _buffer(workspace: dict, name: str, shape, dtype, device) -> torch.Tensor:
    """A reusable scratch tensor: large blocks are not re-allocated (and re-faulted) per block."""
    numel = 1
    for size in shape:
        numel *= size
    buffer = workspace.get(name)
    if buffer is None or buffer.numel() < numel or buffer.dtype != dtype:
        buffer = torch.empty(numel, dtype=dtype, device=device)
        workspace[name] = buffer
    return buffer[:numel].view(shape)
