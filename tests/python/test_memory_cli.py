"""`torchcap show FILE --memory`: the memory plan as text, JSON and a picture."""

import json
import os
import xml.etree.ElementTree as ET

import pytest
from cli_helpers import run


@pytest.fixture(scope="module")
def cnn_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cnn") / "cnn.tcg"
    run("trace", "--example", "cnn_bn_eval", "-o", path)
    return path


def test_text(cnn_file):
    out = run("show", cnn_file, "--memory").stdout
    assert out.startswith("memory plan: ")
    for line in ("naive (no reuse)", "greedy (ExecuTorch)", "best fit by size", "chosen: ", "lower bound",
                 "live at the peak, step ", "through an out variant: "):
        assert line in out, line
    # The convolutions' out variant is a composite: listed as falling back.
    assert "aten::convolution (2 nodes): aten::convolution.out is a composite" in out


def test_json(cnn_file):
    j = json.loads(run("show", cnn_file, "--memory", "--json").stdout)
    assert j["alignment"] == 64
    assert j["lower_bound_bytes"] <= j["arena_bytes"] <= j["greedy_bytes"] <= j["naive_bytes"]
    assert j["arena_bytes"] == min(j["greedy_bytes"], j["best_fit_bytes"])
    live = [v for v in j["values"] if v["first"] <= j["peak_step"] <= v["last"] and v["size"] > 0]
    assert sorted(f'{v["node"]}' for v in live) == sorted(name.split("[")[0] for name in j["live_at_peak"])
    for v in j["values"]:
        assert v["offset"] % 64 == 0 and v["offset"] + v["size"] <= j["arena_bytes"]
    assert {"node", "target", "out_variant", "fallback"} <= set(j["operators"][0])


def test_svg(cnn_file, tmp_path):
    svg = tmp_path / "arena.svg"
    out = run("show", cnn_file, "--memory", "--svg", svg).stdout
    assert f"drew the arena to {svg}" in out
    root = ET.parse(svg).getroot()
    rects = root.findall("{http://www.w3.org/2000/svg}rect")
    j = json.loads(run("show", cnn_file, "--memory", "--json").stdout)
    assert len(rects) == 1 + sum(1 for v in j["values"] if v["size"] > 0)  # the frame, then one per buffer


def test_memory_excludes_other_views(cnn_file):
    result = run("show", cnn_file, "--memory", "--graph", check=False)
    assert result.returncode == 2
