"""`bapipe models | boards | clusters | profile --json` against the CLI contract and the zoo."""
import json

import pytest

from bapipe import zoo
import cli_fork


def bapipe(*args):
    r = cli_fork.bapipe(*args)   # the console script, forked (tests/cli_fork.py)
    return r.returncode, r.stdout, r.stderr


def test_models_json_matches_zoo():
    rc, out, _ = bapipe("models", "--json")
    assert rc == 0
    d = json.loads(out)
    got = {m["name"]: m for m in d["models"]}
    assert set(got) == set(zoo.ZOO)
    assert got["vgg16"]["params"] == 138_357_544 and round(got["vgg16"]["fwd_macs"] / 1e9, 2) == 15.47
    assert got["resnet50"]["params"] == 25_557_032 and round(got["resnet50"]["fwd_macs"] / 1e9, 2) == 4.09
    assert got["vgg16"]["layers"] == len(zoo.get("vgg16").layers)


def test_clusters_and_boards_json():
    rc, out, _ = bapipe("clusters", "--json")
    d = json.loads(out)
    c = {x["name"]: x for x in d["clusters"]}
    assert c["4xU250-ring"]["boards"] == 4 and c["4xU250-ring"]["board_types"] == ["U250"]
    assert c["16xVCU118-torus"]["topology"] == "torus2d" and c["64xU55C"]["boards"] == 64
    rc, out, _ = bapipe("boards", "--json")
    b = {x["name"]: x for x in json.loads(out)["boards"]}
    assert b["U250"]["dsp"] == 12288 and b["U250"]["usable_dsp"] == 11520 and b["U250"]["clock_hz"] > 0
    assert {"U250", "U280", "U55C", "VCU118", "ZCU102", "S10MX", "V100", "A100"} <= set(b)


def test_profile_json_layers_and_costs():
    rc, out, err = bapipe("profile", "vgg16", "4xU250-ring", "--json")
    assert rc == 0, err
    d = json.loads(out)
    layers = d["layers"]
    assert [l["name"] for l in layers] == [l.name for l in zoo.get("vgg16").layers]
    conv1 = layers[0]
    assert conv1["fwd_macs"] == 86_704_128 and conv1["bwd_macs"] == 2 * 86_704_128
    assert conv1["activation_bytes"] == 64 * 224 * 224 * 2  # fixed16
    assert conv1["weight_bytes"] == (64 * 27 + 64) * 2
    c = conv1["cost"]["U250"]
    # no faster than every usable DSP doing one MAC per cycle at the kernel clock
    assert c["fwd_s"] >= 86_704_128 / (11520 * 300e6) * 0.999
    assert c["bwd_s"] > c["fwd_s"]


def test_profile_heterogeneous_cluster_has_every_type():
    rc, out, err = bapipe("profile", "tiny-cnn", "hetero-mix", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert set(d["layers"][0]["cost"]) == {"U250", "U280", "VCU118"}


@pytest.mark.parametrize("args,needle", [
    (("profile", "nosuchmodel", "4xU250-ring"), "MODEL"),
    (("profile", "vgg16", "nosuchcluster"), "cluster"),
    (("profile", "vgg16", "4xU250-ring", "--format", "fp64"), "--format"),
])
def test_profile_bad_arguments_exit_2(args, needle):
    rc, out, err = bapipe(*args)
    assert rc == 2 and err.count("\n") == 1 and needle in err and "Traceback" not in err
