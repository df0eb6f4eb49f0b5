"""The torchvision zoo through torchcap: every family that scripts, with small
inputs and random weights, traced and exported by the `torchcap` command,
checked against eager in C++ (`torchcap trace` runs the graph and the model and
reports the largest difference) and in Python (`torchcap.load` of both saved
graphs, run on the same inputs), and the exported graph checked functional
(no operator writes its arguments or returns a view of them); then the traced
graph optimized for inference by `torchcap optimize` (docs/optimize.md),
checked by the command against the graph and by the loader against eager.

    python3 zoo.py --cli build/torchcap [--only NAME,...] [--smallest] [--keep DIR]

Prints one line per model and a summary; exits non-zero if any model fails.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

import torch
import torchvision
from torchvision.models import maxvit, optical_flow, segmentation, video

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
from torchcap._load import load  # noqa: E402  (the loader only: no compiled part needed)

TOLERANCE = 1e-4


def image(size=64, batch=1):
    return torch.randn(batch, 3, size, size)


def small_vit():
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                num_heads=2, hidden_dim=32, mlp_dim=64,
                                                num_classes=10)


def small_maxvit():
    return maxvit.MaxVit(input_size=(64, 64), stem_channels=16, partition_size=2,
                         block_channels=[16, 32], block_layers=[1, 1], head_dim=8,
                         stochastic_depth_prob=0.0, num_classes=10)


def small_mvit():
    config = video.mvit.MSBlockConfig
    blocks = [
        config(num_heads=1, input_channels=16, output_channels=16, kernel_q=[3, 3, 3],
               kernel_kv=[3, 3, 3], stride_q=[1, 1, 1], stride_kv=[1, 2, 2]),
        config(num_heads=2, input_channels=16, output_channels=32, kernel_q=[3, 3, 3],
               kernel_kv=[3, 3, 3], stride_q=[1, 2, 2], stride_kv=[1, 1, 1]),
    ]
    return video.MViT(spatial_size=(32, 32), temporal_size=4, block_setting=blocks,
                      residual_pool=True, residual_with_cls_embed=False, rel_pos_embed=True,
                      proj_after_attn=True, num_classes=10)


def transformer_encoder():
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                             batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=2)


def tv(name, **kwargs):
    return lambda: getattr(torchvision.models, name)(weights=None, **kwargs)


def seg(name):
    return lambda: getattr(segmentation, name)(weights=None, weights_backbone=None,
                                               num_classes=5, aux_loss=False)


# name, family, constructor, inputs (given to the CLI in order), smallest in its family
MODELS = [
    ("resnet18", "classification", tv("resnet18"), lambda: [image()], True),
    ("resnext50_32x4d", "classification", tv("resnext50_32x4d"), lambda: [image()], False),
    ("densenet121", "classification", tv("densenet121"), lambda: [image()], False),
    ("efficientnet_b0", "classification", tv("efficientnet_b0"), lambda: [image()], False),
    ("efficientnet_v2_s", "classification", tv("efficientnet_v2_s"), lambda: [image()], False),
    ("googlenet", "classification", tv("googlenet", aux_logits=False, init_weights=False),
     lambda: [image()], False),
    ("inception_v3", "classification", tv("inception_v3", aux_logits=False, init_weights=False),
     lambda: [image(80)], False),
    ("mobilenet_v2", "classification", tv("mobilenet_v2"), lambda: [image()], False),
    ("mobilenet_v3_small", "classification", tv("mobilenet_v3_small"), lambda: [image()], True),
    ("mnasnet0_5", "classification", tv("mnasnet0_5"), lambda: [image()], False),
    ("regnet_y_400mf", "classification", tv("regnet_y_400mf"), lambda: [image()], True),
    ("shufflenet_v2_x0_5", "classification", tv("shufflenet_v2_x0_5"), lambda: [image()], False),
    ("squeezenet1_1", "classification", tv("squeezenet1_1"), lambda: [image()], True),
    ("vgg11", "classification", tv("vgg11"), lambda: [image(32)], False),
    ("convnext_tiny", "classification", tv("convnext_tiny"), lambda: [image()], False),
    ("vit (small)", "classification", small_vit, lambda: [image(32)], True),
    ("swin_t", "classification", tv("swin_t"), lambda: [image()], False),
    ("maxvit (small)", "classification", small_maxvit, lambda: [image()], True),
    ("fcn_resnet50", "segmentation", seg("fcn_resnet50"), lambda: [image()], False),
    ("deeplabv3_mobilenet_v3_large", "segmentation", seg("deeplabv3_mobilenet_v3_large"),
     lambda: [image()], False),
    ("lraspp_mobilenet_v3_large", "segmentation", seg("lraspp_mobilenet_v3_large"),
     lambda: [image()], True),
    ("r3d_18", "video", lambda: video.r3d_18(weights=None),
     lambda: [torch.randn(1, 3, 4, 32, 32)], True),
    ("mvit (small)", "video", small_mvit, lambda: [torch.randn(1, 3, 4, 32, 32)], False),
    ("raft_small", "optical flow", lambda: optical_flow.raft_small(weights=None),
     lambda: [image(128), image(128), 2], False),
    ("transformer_encoder", "sequence", transformer_encoder, lambda: [torch.randn(1, 10, 32)], True),
]


def cli_input(value, path):
    """How the CLI is given one argument: a tensor file, or the number itself."""
    if isinstance(value, torch.Tensor):
        torch.save(value, path)
        return str(path)
    return str(value)


def flatten(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flatten(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flatten(v)]
    return []


def max_diff(actual, expected):
    a, e = flatten(actual), flatten(expected)
    if len(a) != len(e):
        raise AssertionError(f"{len(a)} output tensors, eager has {len(e)}")
    return max([(x.double() - y.double()).abs().max().item() if x.numel() else 0.0
                for x, y in zip(a, e)] + [0.0])


def writes_or_views(gm):
    """The operators of a graph that write an argument or return a view."""
    bad = set()
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments) or \
                any(r.alias_info is not None for r in schema.returns):
            bad.add(str(node.target))
    return sorted(bad)


def torchcap_cli(cli, *args):
    result = subprocess.run([cli, *map(str, args)], capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError(f"torchcap {' '.join(map(str, args))}: {result.stderr.strip()}")
    return json.loads(result.stdout)


def check(cli, name, make_model, make_inputs, work):
    torch.manual_seed(0)
    model = make_model().eval()
    inputs = make_inputs()
    with torch.no_grad():
        expected = model(*inputs)
    script = work / "model.pt"
    torch.jit.script(model).save(str(script))
    args = []
    for i, value in enumerate(inputs):
        args += ["--input", cli_input(value, work / f"input{i}.pt")]

    report = {}
    for mode, flags in (("trace", []), ("export", ["--export"])):
        graph = work / f"{mode}.tcg"
        start = time.perf_counter()
        j = torchcap_cli(cli, "trace", script, *args, *flags, "-o", graph, "--json")
        report[f"{mode}_s"] = time.perf_counter() - start
        report[f"{mode}_nodes"] = j["nodes"]
        if j["max_abs_diff"] > TOLERANCE:
            raise AssertionError(f"{mode}: the graph differs from eager by {j['max_abs_diff']:.3g} (C++)")
        gm = load(str(graph))
        # Every argument, numbers included, as the model takes them.
        with torch.no_grad():
            actual = gm(*inputs)
        diff = max_diff(actual, expected)
        if diff > TOLERANCE:
            raise AssertionError(f"{mode}: the loaded graph differs from eager by {diff:.3g} (Python)")
        report[f"{mode}_diff"] = max(diff, j["max_abs_diff"])
        if mode == "export":
            bad = writes_or_views(gm)
            if bad:
                raise AssertionError(f"export: not functional, calls {', '.join(bad)}")
    # The traced graph optimized for inference (docs/optimize.md), checked by
    # the command against the graph, and run by the command on the model's
    # inputs against eager. Its packed convolutions are torchcap's own
    # operators, which only the compiled part registers: this loader (pure
    # Python) must refuse the file by saying so (tests/python/test_optimize.py
    # loads the same models with the compiled one).
    optimized = work / "optimized.tcg"
    j = torchcap_cli(cli, "optimize", work / "trace.tcg", "-o", optimized, "--json")
    outputs = work / "optimized_outputs.pt"
    torchcap_cli(cli, "run", optimized, *args, "-o", outputs, "--json")
    diff = max(j["max_abs_diff"], max_diff(torch.load(str(outputs)), expected))
    try:
        with torch.no_grad():
            diff = max(diff, max_diff(load(str(optimized))(*inputs), expected))
    except ValueError as e:
        if "is one of torchcap's own operators" not in str(e):
            raise
    if diff > TOLERANCE:
        raise AssertionError(f"optimize: the optimized graph differs from eager by {diff:.3g}")
    report["optimized_diff"] = diff
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cli", required=True, help="the torchcap executable")
    parser.add_argument("--only", help="comma-separated model names")
    parser.add_argument("--smallest", action="store_true", help="the smallest model of each family")
    args = parser.parse_args()
    torch.set_num_threads(1)

    chosen = [m for m in MODELS if (not args.smallest or m[4]) and
              (not args.only or m[0] in args.only.split(","))]
    failures = 0
    start = time.perf_counter()
    for name, family, make_model, make_inputs, _ in chosen:
        with tempfile.TemporaryDirectory(prefix="torchcap_zoo_") as tmp:
            t0 = time.perf_counter()
            try:
                r = check(args.cli, name, make_model, make_inputs, pathlib.Path(tmp))
                print(f"ok    {name:30s} {family:15s} {r['trace_nodes']:5d} nodes "
                      f"(exported {r['export_nodes']:5d})  max diff {r['trace_diff']:.1e} / "
                      f"{r['export_diff']:.1e} / optimized {r['optimized_diff']:.1e}  "
                      f"{time.perf_counter() - t0:6.1f} s", flush=True)
            except Exception as e:  # noqa: BLE001  (reported per model, counted below)
                failures += 1
                message = str(e).splitlines()[0] if str(e) else type(e).__name__
                print(f"FAIL  {name:30s} {family:15s} {message}", flush=True)
    passed = len(chosen) - failures
    print(f"{passed} of {len(chosen)} models traced, exported, optimized and matched eager "
          f"(<= {TOLERANCE:g}) in C++ and Python; {time.perf_counter() - start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
