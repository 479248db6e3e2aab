"""A population of learners' networks as rows of stacked tensors: what one batched call over all of them reads.

Reference: PureJaxRL (C. Lu, J. Kuba, A. Letcher, L. Metz, C. Schroeder de Witt and J. Foerster, 2022, "Discovered
Policy Optimisation", NeurIPS; github.com/luchris429/purejaxrl) trains many agents at once by ``vmap`` over their
stacked parameters, so that P small networks cost about what one does; here with ``torch.func``.

Each member stays an ordinary module, so its own ``learner_step``, optimizer, checkpoint and PBT copy
(``algos/pbt.py``'s ``copy_member``) work on it as on a single learner; but its parameters and buffers *are* row i of
one [P, ...] tensor per name (``_stacked``). A member's optimizer step or ``load_state_dict`` writes its row in place,
so the batched forward (``policies/members.py``) and the batched update (``algos/population_vtrace.py``) read every
member's latest values with no copy and no re-stacking.

The trade-off, against re-stacking the members' weights after each update: no copy of P networks per update and no
moment where the inference loop reads a stack half rebuilt, for one rule: a member's tensors may not be replaced, only
written (no ``.to()`` onto another device or dtype, no ``load_state_dict(assign=True)``, no new ``Parameter``), or its
updates no longer reach the stack. ``check`` says when one was.
"""

from __future__ import annotations

import copy
import threading
from typing import Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call


class _Method(nn.Module):
    """Runs one method of the wrapped network: ``functional_call`` calls only ``forward``, learners ``unroll`` too."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, method: str, *args):
        return getattr(self.net, method)(*args)


def _stacked(rows: list[Tensor]) -> Tensor:
    """[P, *shape] holding ``rows`` (P tensors of one shape), each row with the strides of the first."""
    t = rows[0]
    dense = t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last))
    strides = t.stride() if dense else torch.empty(t.shape).stride()
    out = torch.empty_strided((len(rows),) + tuple(t.shape), (max(t.numel(), 1),) + tuple(strides), dtype=t.dtype,
                              device=t.device)
    return out.copy_(torch.stack(rows))


def _template(net: nn.Module) -> nn.Module:
    """A copy of ``net`` without storage (on the meta device), which ``functional_call`` runs on each member's
    tensors: never a member itself, whose attributes the call would swap under the learner's feet."""
    twin = copy.deepcopy(net).to("meta")
    for m in twin.modules():
        # vmap cannot lay an input out channels-last (it refuses to query that layout): inside the batched call
        # a convolution is one grouped convolution over members anyway.
        if getattr(m, "channels_last", False):
            m.channels_last = False
    return twin


class MemberStack:
    """P networks of one architecture (``members``) whose parameters (``params``) and buffers (``buffers``) are
    rows of [P, ...] tensors, one per name; ``call`` runs the architecture on any such tensors (a member's rows
    under vmap). Build the members' optimizers before or after: each parameter keeps its identity, only its
    storage moves into the stack."""

    def __init__(self, members: Sequence[nn.Module]):
        self.members = list(members)
        if not self.members:
            raise ValueError("a population needs at least one member")
        layouts = [{n: (t.shape, t.dtype, t.device) for n, t in (*m.named_parameters(), *m.named_buffers())}
                   for m in self.members]
        for i, theirs in enumerate(layouts[1:], 1):
            if theirs != layouts[0]:
                raise ValueError(f"member {i}'s network differs from member 0's (names, shapes, dtypes or devices)")
        self.template = _template(self.members[0])  # the architecture, for its attributes (lstm, core_spec)
        self._local = threading.local()
        self.params = self._stack([dict(m.named_parameters()) for m in self.members])
        self.buffers = self._stack([dict(m.named_buffers()) for m in self.members])

    def _stack(self, tensors: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        stacked = {}
        for name in tensors[0]:
            stacked[name] = _stacked([t[name].detach() for t in tensors])
            for i, t in enumerate(tensors):
                t[name].data = stacked[name][i]  # the same Parameter (optimizers keep it), its storage the row
        return stacked

    def __len__(self) -> int:
        return len(self.members)

    def tensors(self) -> dict[str, Tensor]:
        """Every stacked parameter and buffer by name, [P, ...] each."""
        return {**self.params, **self.buffers}

    def call(self, tensors: dict[str, Tensor], method: str, *args):
        """``method`` of the architecture run on ``tensors`` (one member's parameters and buffers by name)."""
        return functional_call(self._here(), {f"net.{k}": v for k, v in tensors.items()}, (method, *args))

    def _here(self) -> _Method:
        """This thread's copy of the template: ``functional_call`` puts the tensors it is given into the module
        for the length of the call, so the inference thread's forward and the learner's update must never run
        on one module at once."""
        if getattr(self._local, "template", None) is None:
            self._local.template = _Method(copy.deepcopy(self.template))
        return self._local.template

    def check(self) -> None:
        """Raise if a member's tensor is no longer its row of the stack (see the module docstring)."""
        stacked = self.tensors()
        for i, m in enumerate(self.members):
            for name, t in (*m.named_parameters(), *m.named_buffers()):
                row = stacked[name][i]
                if t.data_ptr() != row.data_ptr() or t.stride() != row.stride() or t.shape != row.shape:
                    raise RuntimeError(f"member {i}'s {name} is no longer its row of the population's stacked "
                                       "tensors (replaced, not written: .to(), load_state_dict(assign=True) or a "
                                       "new Parameter), so the batched forward and update would not see it")
