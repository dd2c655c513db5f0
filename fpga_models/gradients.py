"""Which backward passes a model's layers run: the one rule for the planner and the generators.

A layer's backward has two parts (fpga_models.cost.LayerCost): the weight gradient
(``bwd_w``, layers with parameters) and the input gradient (``bwd_in``: dx, for the layer
before it). Nothing reads the gradient of a tensor that no parameter lies upstream of -- above
all the model's input -- so no part builds or charges it (autograd's ``requires_grad``): the
model's first convolution computes its dW and no dx, and an element-wise layer between the
input and the first weighted layer has no backward at all.

Read by the planner's layer table (planner.stagecost), the stage allocation
(fpga_models.allocate), the backward kernel's memory (fpga_models.bwd_memory), the HLS backward
kernel and its plan figure (codegen.design.backward), the board's DSP count (fpga_models.allocate
.kernel_dsp via codegen.design.placement: no input-gradient array where no dx) and the training RTL
(codegen.rtl.train).
"""
from __future__ import annotations

from collections import OrderedDict

from bapipe.spec import Model


#: the last few models' gradient tensors, by identity (the planner asks about one model
#: hundreds of times a search: gpt3-175b 898 walks of 1,000 layers; hashing a Model by value
#: would cost as much as the walk)
_RECENT: OrderedDict[int, tuple[Model, frozenset[str]]] = OrderedDict()
_RECENT_MAX = 8


def gradient_tensors(model: Model) -> frozenset[str]:
    """Tensors whose gradient the backward computes: the output of every layer with parameters
    and of every layer one of whose inputs has a gradient (model inputs have none)."""
    hit = _RECENT.get(id(model))
    if hit is not None and hit[0] is model:
        return hit[1]
    out: set[str] = set()
    for l in model.layers:   # topological order
        if l.params > 0 or any(i in out for i in l.inputs):
            out.add(l.name)
    _RECENT[id(model)] = (model, frozenset(out))
    while len(_RECENT) > _RECENT_MAX:
        _RECENT.popitem(last=False)
    return _RECENT[id(model)][1]


def no_input_gradient(model: Model) -> frozenset[str]:
    """Names of the layers whose backward computes no input gradient: none of their inputs has a
    gradient (:func:`gradient_tensors`), i.e. they are fed only by the model's input through
    layers without parameters."""
    g = gradient_tensors(model)
    return frozenset(l.name for l in model.layers if not any(i in g for i in l.inputs))


def backward_work(bwd_in, bwd_w, needs_dx: bool):
    """A layer's backward cycles (or MACs): its weight gradient's, plus its input gradient's when
    it needs one (a layer without parameters has ``bwd_w`` 0, so it has no backward without one)."""
    return bwd_w + (bwd_in if needs_dx else 0)
