"""Dynamic shapes from Python (Note [Dynamic shapes by aligned traces] in
src/trace/dynamic.cpp): torchvision's models and transformer blocks traced
once with a dynamic batch (and sequence length), run at other sizes through
the traced module, the exported one, a file loaded back, and the C++
command; sizes out of range refused, inputs untouched."""

import math
import os
import subprocess

import pytest
import torch
import torch.nn as nn
import torchvision

import torchcap
from torchcap import Dim

torch.manual_seed(0)
TORCHCAP = os.environ.get("TORCHCAP_CLI")


class Decoder(nn.Module):
    """GPT-style: learned positions sliced by the length, a causal mask built
    from it."""

    def __init__(self, vocab=50, d=32, heads=4, layers=2, context=16):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Parameter(torch.randn(context, d) * 0.02)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0,
                                                               batch_first=True, norm_first=True)
                                    for _ in range(layers))
        self.ln = nn.LayerNorm(d)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe[:t]
        mask = torch.full((t, t), float("-inf")).triu(1)
        for block in self.blocks:
            x = block(x, src_mask=mask)
        return self.ln(x) @ self.wte.weight.t()


class Encoder(nn.Module):
    """BERT-style: token and position embeddings, attention that ignores
    padded positions (mask 0), written out as BERT's self-attention is."""

    def __init__(self, vocab=50, d=32, heads=4, context=16):
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(context, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, ids, attention_mask):
        b, t = ids.shape
        positions = torch.arange(t, device=ids.device).expand(b, t)
        x = self.tok(ids) + self.pos(positions)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        split = lambda z: z.view(b, t, self.heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(attention_mask[:, None, None, :] == 0, float("-inf"))
        a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
        x = self.ln(x + self.out(a))
        return x + self.ff(x)


def vit():
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                num_heads=2, hidden_dim=32, mlp_dim=64)


def images(b):
    return (torch.randn(b, 3, 32, 32),)


def tokens(b, t):
    return (torch.randint(0, 50, (b, t)),)


def masked_tokens(b, t):
    mask = torch.ones(b, t, dtype=torch.long)
    mask[0, t // 2:] = 0  # the first sequence is padded
    return (torch.randint(0, 50, (b, t)), mask)


BATCH = Dim("batch", min=1, max=16)
SEQ = Dim("seq", min=1, max=16)

# name: (model, example inputs, dynamic_shapes, sizes to run at, inputs at a size)
CASES = {
    "resnet18": (lambda: torchvision.models.resnet18(), images(2), ({0: BATCH},),
                 [1, 3, 5, 9], images),
    "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(), images(2),
                           ({0: BATCH},), [1, 3, 4, 7], images),
    "vit": (vit, images(2), ({0: BATCH},), [1, 3, 5, 8], images),
    "gpt_decoder": (Decoder, tokens(2, 5), ({0: BATCH, 1: SEQ},),
                    [(1, 1), (1, 9), (3, 4), (4, 16)], lambda s: tokens(*s)),
    "bert_encoder": (Encoder, masked_tokens(2, 6), ({0: BATCH, 1: SEQ}, {0: BATCH, 1: SEQ}),
                     [(1, 3), (3, 7), (4, 2), (2, 16)], lambda s: masked_tokens(*s)),
}


def close(a, b):
    return torch.allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_traced_once_runs_at_other_sizes(name, tmp_path):
    make, example, shapes, sizes, inputs_at = CASES[name]
    model = make().eval()
    gm = torchcap.trace(model, example, dynamic_shapes=shapes)
    exported = torchcap.export(model, example, dynamic_shapes=shapes)
    torchcap.save(gm, tmp_path / "m.tcg")
    loaded = torchcap.load(tmp_path / "m.tcg")
    assert any(n.target is torch.ops.aten.sym_size for n in gm.graph.nodes)
    with torch.no_grad():
        for size in sizes:
            args = inputs_at(size)
            expected = model(*args)
            assert close(gm(*args), expected), size
            assert close(exported(*args), expected), size
            assert close(loaded(*args), expected), size
        # torch.fx's own code of the graph, sym_size and operator.mul included.
        loaded.recompile()
        args = inputs_at(sizes[-1])
        assert close(loaded(*args), model(*args))
        if TORCHCAP is not None:  # the C++ command, on the exported graph
            torchcap.save(exported, tmp_path / "e.tcg")
            command = [TORCHCAP, "run", str(tmp_path / "e.tcg"), "-o", str(tmp_path / "out.pt")]
            for i, a in enumerate(args):
                torch.save(a, tmp_path / f"in{i}.pt")
                command += ["--input", str(tmp_path / f"in{i}.pt")]
            subprocess.run(command, check=True, capture_output=True)
            out = torch.load(tmp_path / "out.pt")
            assert close(out[0] if isinstance(out, (list, tuple)) else out, model(*args))


def test_out_of_range_and_inconsistent_sizes_are_refused():
    model = Encoder().eval()
    gm = torchcap.trace(model, masked_tokens(2, 6), dynamic_shapes=({0: BATCH, 1: SEQ},) * 2)
    ids, mask = masked_tokens(2, 17)
    kept = ids.clone()
    with pytest.raises(torchcap.InputError, match=r"input 0 \(ids\): dimension 1 is 17, outside "
                                                  r"the range \[1, 16\] of s1 \(seq\)"):
        gm(ids, mask)
    assert torch.equal(ids, kept)
    with pytest.raises(torchcap.InputError, match=r"input 1 \(attention_mask\): dimension 1 is 5, but it is "
                                                  r"s1 \(seq\), which another input's dimension "
                                                  r"makes 6"):
        gm(torch.randint(0, 50, (2, 6)), torch.ones(2, 5, dtype=torch.long))


def test_a_decoder_saved_from_python_runs_in_cpp_at_a_new_length(tmp_path):
    if TORCHCAP is None:
        pytest.skip("TORCHCAP_CLI names the command")
    model = Decoder().eval()
    torchcap.save(torchcap.export(model, tokens(2, 5), dynamic_shapes=({0: BATCH, 1: SEQ},)),
                  tmp_path / "decoder.tcg")
    ids = torch.randint(0, 50, (3, 11))
    torch.save(ids, tmp_path / "ids.pt")
    subprocess.run([TORCHCAP, "run", str(tmp_path / "decoder.tcg"), "--input",
                    str(tmp_path / "ids.pt"), "-o", str(tmp_path / "out.pt")],
                   check=True, capture_output=True)
    out = torch.load(tmp_path / "out.pt")
    out = out[0] if isinstance(out, (list, tuple)) else out
    with torch.no_grad():
        assert close(out, model(ids))
    shown = subprocess.run([TORCHCAP, "show", str(tmp_path / "decoder.tcg")], check=True,
                           capture_output=True, text=True).stdout
    assert "i64[s0, s1]" in shown


def test_a_training_step_takes_any_batch():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    eager = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    eager.load_state_dict(model.state_dict())
    step = torchcap.export_training(
        model, nn.functional.mse_loss, (torch.randn(2, 4),), (torch.randn(2, 2),),
        optimizer=torch.optim.Adam(model.parameters(), lr=0.05),
        dynamic_shapes=(({0: BATCH},), ({0: BATCH},)))
    optimizer = torch.optim.Adam(eager.parameters(), lr=0.05)
    for b in (1, 3, 6):
        x, y = torch.randn(b, 4), torch.randn(b, 2)
        loss = step(x, y)["loss"]
        optimizer.zero_grad()
        expected = nn.functional.mse_loss(eager(x), y)
        expected.backward()
        optimizer.step()
        assert close(loss, expected.detach()), b
    for (name, p), q in zip(step.named_parameters(), eager.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), name
    with pytest.raises(torchcap.InputError, match="outside the range"):
        step(torch.randn(17, 4), torch.randn(17, 2))


def test_shape_logic_that_cannot_be_captured_is_an_error():
    class ByParity(nn.Module):
        def forward(self, x):
            return x.relu() if x.shape[0] % 2 == 0 else x.sigmoid()

    with pytest.raises(torchcap.TraceError, match="records a different graph at batch=3 than at "
                                                  "batch=2"):
        torchcap.trace(ByParity(), (torch.randn(2, 3),), dynamic_shapes=({0: Dim("batch")},))

    class ByValue(nn.Module):
        def forward(self, x):
            return x[: int(x.sum().abs().item()) % 2 + 1]

    with pytest.raises(torchcap.TraceError, match="item"):
        torchcap.trace(ByValue(), (torch.randn(4, 3),), dynamic_shapes=({0: Dim("batch")},))

    class ScaledBySize(nn.Module):  # a float of a size: a constant of the graph
        def forward(self, x):
            return x / math.sqrt(x.shape[1])

    with pytest.raises(torchcap.TraceError, match=r"at %div \(aten::div.Tensor\), the program "
                                                  r"gives the number 2 at t=4 and 1.41421 at t=2: "
                                                  r"a float computed from a dynamic size"):
        torchcap.trace(ScaledBySize(), (torch.randn(2, 4),), dynamic_shapes=({1: Dim("t")},))

    class Clamped(nn.Module):
        def forward(self, x):
            return x[: min(x.shape[0], 4)] * 2

    with pytest.raises(torchcap.TraceError, match="cannot express"):
        torchcap.trace(Clamped(), (torch.randn(2, 3),), dynamic_shapes=({0: Dim("batch")},))


def test_dynamic_shapes_that_do_not_fit_the_arguments_are_refused():
    model = nn.Linear(3, 2)
    with pytest.raises(TypeError, match=r"dynamic_shapes\[0\]: expected None or \{dim: Dim\}"):
        torchcap.trace(model, (torch.randn(2, 3),), dynamic_shapes=(Dim("batch"),))
    with pytest.raises(TypeError, match="one entry per positional argument"):
        torchcap.trace(model, (torch.randn(2, 3),), dynamic_shapes={0: Dim("batch")})
    with pytest.raises(torchcap.TraceError, match="has 2 dimension"):
        torchcap.trace(model, (torch.randn(2, 3),), dynamic_shapes=({5: Dim("batch")},))


def test_python_numbers_of_sizes_follow_the_size(tmp_path):
    """Note [Python numbers as tensors]: an integer size divides as a Python
    number (a size computation given for the Tensor parameter), and a float
    of a size computed with tensor operations follows the size, as the
    message for math.sqrt advises; both keep float32, before and after a
    file."""
    class ByCount(nn.Module):
        def forward(self, x):
            return x / x.shape[1]

    class ByRoot(nn.Module):
        def forward(self, x):
            return x / x.new_full((), x.shape[1]).sqrt()

    for model in (ByCount(), ByRoot()):
        gm = torchcap.trace(model, (torch.randn(2, 4),), dynamic_shapes=({1: Dim("t")},))
        torchcap.save(gm, tmp_path / "m.tcg")
        back = torchcap.load(tmp_path / "m.tcg")
        for t in (2, 3, 8):
            x = torch.randn(2, t)
            for m in (gm, back):
                assert m(x).dtype == torch.float32
                torch.testing.assert_close(m(x), model(x), rtol=0, atol=0)
