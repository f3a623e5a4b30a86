"""The plan builds a verify plan once per plan buffer: handed a ``VerifyPlan`` it has filled
before, it plans into a scratch verify plan and leaves the one it was given as its first
launch left it (as if a captured graph always replayed the batch it was captured with). It
breaks CONTRACT §12 only when one verify plan serves many plan launches, as SGLang's plans do
under CUDA-graph replay, where each replay plans into the buffers the last one left: the
verify then checks a past batch's entries. Every launch into a new verify plan is canary's.
Kept safe: the scratch plan has the capacity of the one it stands for, and the write plan is
filled as canary fills it."""

import torch

import canary.plan as plan_module
from canary.buffers import VerifyPlan
from strength.known_bad._mutate import export, install

_real = plan_module.launch_canary_plan_kernels
_filled: list[torch.Tensor] = []  # the verify plans' slot tensors filled so far


def launch_canary_plan_kernels(**kwargs):
    plan = kwargs.get("verify_plan_out")
    slots = getattr(plan, "verify_slot_indices", None)
    if not isinstance(slots, torch.Tensor) or slots.dim() != 1:
        return _real(**kwargs)
    if any(t is slots for t in _filled):
        scratch = VerifyPlan.allocate(verify_capacity=max(1, slots.shape[0]), device=slots.device)
        return _real(**{**kwargs, "verify_plan_out": scratch})
    _real(**kwargs)
    _filled.append(slots)  # a refused launch raised above and is not remembered


install(plan_module, "launch_canary_plan_kernels", launch_canary_plan_kernels)

export(globals())
