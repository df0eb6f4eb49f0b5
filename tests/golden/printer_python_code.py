import operator

import torch
from torch import device


def forward(self, ph_0, ph_1):
    fc_weight = self.fc.weight
    fc_bias = self.fc.bias
    t = torch.ops.aten.t.default(fc_weight);  fc_weight = None
    addmm = torch.ops.aten.addmm.default(fc_bias, ph_0, t);  fc_bias = t = ph_0 = None
    topk = torch.ops.aten.topk.default(addmm, 3, largest=False);  addmm = None
    getitem = operator.getitem(topk, 0)
    getitem_1 = operator.getitem(topk, 1);  topk = None
    zeros = torch.ops.aten.zeros.default([2, 3], dtype=torch.float32, layout=torch.strided, device=device(type='cpu'), pin_memory=False)
    add = torch.ops.aten.add.Tensor(getitem, zeros, alpha=0.5);  getitem = zeros = None
    div = torch.ops.aten.div.Scalar_mode(add, 1e-05, rounding_mode='floor')
    cat = torch.ops.aten.cat.default([add, div], -1);  add = div = None
    contiguous = torch.ops.aten.contiguous.default(cat, memory_format=torch.contiguous_format);  cat = None
    gather = torch.ops.aten.gather.default(ph_1, 1, getitem_1);  getitem_1 = ph_1 = None
    clamp = torch.ops.aten.clamp.default(contiguous, None, 1e+20);  contiguous = None
    return (clamp, {'indices': gather, 'none': None})
