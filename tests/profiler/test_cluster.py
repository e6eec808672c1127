"""Cluster presets and user cluster files (profiler/cluster.py): every preset loads with its
datasheet numbers (written out here from the vendor documents, not read from the files), user TOML
and JSON files load, each kind of bad file is refused with one line naming the file and the field,
and a cluster written as JSON reads back equal."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import pytest

from profiler.cluster import (
    Cluster,
    ClusterError,
    Link,
    PRESET_DIR,
    cluster_from_dict,
    cluster_to_dict,
    cluster_warnings,
    load_cluster,
    preset_names,
)
from tests.conftest import REPO

# Datasheet values, per GPU. peak: dense BF16/FP16 (sparsity figures halved); hbm: GB, GB/s;
# intra: NVLink/xGMI total bidirectional GB/s halved (one way); inter: NIC Gb/s / 8 (GB/s).
DATASHEET = {
    # A100 80GB SXM datasheet: 312 TFLOPS, 80 GB HBM2e 2,039 GB/s, NVLink 600 GB/s;
    # DGX A100: one 200 Gb/s HDR ConnectX-6 per GPU.
    # hbm_gib: the capacity nvidia-smi reports (Modal's table: A100 80GB 81,920 MiB, H100 81,559 MiB,
    # H200 143,771 MiB; Vultr's HGX B200 page: 183,359 MiB), not the marketing GB.
    "a100": dict(peak=312.0, hbm_gib=80.0, hbm_gbps=2039.0, intra=600 / 2, inter=200 / 8),
    # H100 SXM5: 1,979 TFLOPS with sparsity -> 989.4 dense; 80 GB HBM3 3.35 TB/s; NVLink 900 GB/s;
    # DGX H100: one 400 Gb/s NDR ConnectX-7 per GPU.
    "h100": dict(peak=989.4, hbm_gib=round(81559 / 1024, 2), hbm_gbps=3350.0, intra=900 / 2, inter=400 / 8),
    # H200 SXM: same compute as H100 SXM5; 141 GB HBM3e 4.8 TB/s; NVLink 900 GB/s; DGX H200 NDR.
    "h200": dict(peak=989.4, hbm_gib=round(143771 / 1024, 2), hbm_gbps=4800.0, intra=900 / 2, inter=400 / 8),
    # HGX B200: 36 PFLOPS FP16/BF16 sparse for 8 GPUs -> 36000/2/8 dense per GPU; 1,440 GB and
    # 64 TB/s for 8 GPUs; NVLink 5 1.8 TB/s per GPU; DGX B200: 8x ConnectX-7 400 Gb/s.
    "b200": dict(peak=36000 / 2 / 8, hbm_gib=round(183359 / 1024, 2), hbm_gbps=64000 / 8, intra=1800 / 2, inter=400 / 8),
    # MI300X: 1,307.4 TFLOPS BF16 dense, 192 GB HBM3 5.3 TB/s; 7 xGMI links x 64 GB/s one way;
    # Azure ND MI300X v5: 8x 400 Gb/s NDR per 8 GPUs.
    "mi300x": dict(peak=1307.4, hbm_gib=192.0, hbm_gbps=5300.0, intra=7 * 64, inter=400 / 8),
}

# Best BF16 matmul TFLOPS / theoretical, stas00/ml-engineering "Maximum Achievable Matmul FLOPS".
MAMF = {"a100": 271.2 / 312, "h100": 794.5 / 989, "h200": 794.5 / 989, "b200": 1745.0 / 2250, "mi300x": 668.4 / 1300}

FULL_TOML = """\
name = "my-cluster"
peak_tflops = 100.0
hbm_gib = 24
hbm_gbps = 900.0
gpus_per_node = 4
sms = 100
gemm_efficiency = 0.7
hbm_efficiency = 0.9
link_efficiency = 0.6
notes = "lab machines"

[intra]
name = "PCIe 4"
bw_gbps = 25.0
latency_us = 5.0

[inter]
name = "100 GbE"
bw_gbps = 12.5
latency_us = 20
"""


def full_dict() -> dict:
    return {
        "name": "my-cluster", "peak_tflops": 100.0, "hbm_gib": 24, "hbm_gbps": 900.0, "gpus_per_node": 4,
        "intra": {"name": "PCIe 4", "bw_gbps": 25.0, "latency_us": 5.0},
        "inter": {"name": "100 GbE", "bw_gbps": 12.5, "latency_us": 20},
    }


def test_preset_names_are_the_five_files():
    assert preset_names() == ["a100", "b200", "h100", "h200", "mi300x"]


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_preset_numbers_are_the_datasheets(name):
    c = load_cluster(name)
    want = DATASHEET[name]
    assert c.peak_tflops == pytest.approx(want["peak"], abs=0.05)
    assert c.hbm_gib == pytest.approx(want["hbm_gib"])
    assert c.hbm_gbps == pytest.approx(want["hbm_gbps"])
    assert c.gpus_per_node == 8
    assert c.intra.bw_gbps == pytest.approx(want["intra"])
    assert c.inter.bw_gbps == pytest.approx(want["inter"])
    assert c.gemm_efficiency == pytest.approx(MAMF[name], abs=0.005)
    for eff in (c.gemm_efficiency, c.hbm_efficiency, c.link_efficiency):
        assert 0 < eff <= 1
    assert 0 < c.intra.latency_us < c.inter.latency_us
    assert c.source == f"profiler/clusters/{name}.toml"


def test_a100_preset_agrees_with_the_validation_hardware():
    # ../shared/validation/published_runs.md: 312 TFLOP/s, 2.0 TB/s, 300 GB/s each way, 200 Gb/s per GPU.
    c = load_cluster("a100")
    assert (c.peak_tflops, round(c.hbm_gbps / 1000, 1), c.intra.bw_gbps, c.inter.bw_gbps * 8) == (312, 2.0, 300, 200)
    assert c.hbm_bytes == 80 * 2**30


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_every_number_in_a_preset_file_has_a_comment_above(name):
    # Walk up from each numeric field over the fields sharing its comment; a comment must be there.
    lines = (PRESET_DIR / f"{name}.toml").read_text().splitlines()
    field = re.compile(r"^\s*\w+\s*=")
    for i, line in enumerate(lines):
        if field.match(line) and re.search(r"=\s*[-+0-9.]", line):
            j = i - 1
            while j >= 0 and field.match(lines[j]):
                j -= 1
            assert j >= 0 and lines[j].lstrip().startswith("#"), f"{name}.toml line {i + 1}: {line!r} has no source comment"


@pytest.mark.parametrize("spec,stem", [("H100", "h100"), ("h100 sxm", "h100"), ("MI300", "mi300x"),
                                       ("dgx-a100", "a100"), ("HGX_B200", "b200"), (" h200 ", "h200")])
def test_preset_names_are_case_insensitive_with_aliases(spec, stem):
    assert load_cluster(spec) == load_cluster(stem)


def test_user_toml_file_loads(tmp_path):
    p = tmp_path / "lab.toml"
    p.write_text(FULL_TOML)
    c = load_cluster(str(p))
    assert c == Cluster(name="my-cluster", peak_tflops=100.0, hbm_gib=24.0, hbm_gbps=900.0, gpus_per_node=4,
                        intra=Link("PCIe 4", 25.0, 5.0), inter=Link("100 GbE", 12.5, 20.0),
                        gemm_efficiency=0.7, hbm_efficiency=0.9, link_efficiency=0.6, notes=("lab machines",), sms=100)
    assert c.source == str(p)
    assert isinstance(c.gpus_per_node, int) and isinstance(c.hbm_gib, float)
    assert load_cluster(p) == c  # a Path works too


def test_user_json_file_loads_with_defaults(tmp_path):
    data = full_dict()
    del data["name"]
    data["gpus_per_node"] = 4.0  # a whole float is a whole number
    p = tmp_path / "rented.JSON"
    p.write_text(json.dumps(data))
    c = load_cluster(str(p))
    assert c.name == "rented"  # the file's stem
    assert c.gpus_per_node == 4 and isinstance(c.gpus_per_node, int)
    assert (c.gemm_efficiency, c.hbm_efficiency, c.link_efficiency) == (0.8, 0.8, 0.8)
    assert c.notes == ()


def test_latency_zero_is_allowed(tmp_path):
    data = full_dict()
    data["intra"]["latency_us"] = 0
    assert cluster_from_dict(data, source="x.json").intra.latency_us == 0.0


def _refusal(tmp_path, text: str, suffix: str = ".toml") -> str:
    p = tmp_path / f"bad{suffix}"
    p.write_text(text)
    with pytest.raises(ClusterError) as e:
        load_cluster(str(p))
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg
    return msg


def _toml_with(line_old: str, line_new: str) -> str:
    assert line_old in FULL_TOML
    return FULL_TOML.replace(line_old, line_new)


@pytest.mark.parametrize("old,new,field,problem", [
    ("hbm_gbps = 900.0\n", "", "hbm_gbps", "missing field"),
    ("peak_tflops = 100.0", "peak_tflop = 100.0", "peak_tflop", "did you mean peak_tflops"),
    ("bw_gbps = 25.0", "bw_gpbs = 25.0", "intra.bw_gpbs", "did you mean intra.bw_gbps"),
    ('name = "100 GbE"\n', "", "inter.name", "missing field"),
    ("peak_tflops = 100.0", 'peak_tflops = "100"', "peak_tflops", "must be a number"),
    ("gpus_per_node = 4", "gpus_per_node = true", "gpus_per_node", "must be a number, not the boolean true"),
    ("peak_tflops = 100.0", "peak_tflops = nan", "peak_tflops", "finite"),
    ("hbm_gbps = 900.0", "hbm_gbps = inf", "hbm_gbps", "finite"),
    ("hbm_gbps = 900.0", "hbm_gbps = 0", "hbm_gbps", "> 0"),
    ("hbm_gib = 24", "hbm_gib = -24", "hbm_gib", "> 0"),
    ("latency_us = 20", "latency_us = -1", "inter.latency_us", ">= 0"),
    ("gemm_efficiency = 0.7", "gemm_efficiency = 1.5", "gemm_efficiency", "(0, 1]"),
    ("link_efficiency = 0.6", "link_efficiency = 0", "link_efficiency", "> 0"),
    ("gpus_per_node = 4", "gpus_per_node = 4.5", "gpus_per_node", "whole number"),
    ("gpus_per_node = 4", "gpus_per_node = 0", "gpus_per_node", "whole number"),
    ('notes = "lab machines"', "notes = [1, 2]", "notes", "list of strings"),
    ('name = "my-cluster"', 'name = ""', "name", "non-empty string"),
])
def test_bad_field_is_refused_naming_file_and_field(tmp_path, old, new, field, problem):
    msg = _refusal(tmp_path, _toml_with(old, new))
    assert field in msg and problem in msg


@pytest.mark.parametrize("old,new,field", [
    ("hbm_gib = 24", "hbm_gib = 1e300", "hbm_gib"),  # was an OverflowError traceback in hbm_bytes
    ("hbm_gbps = 900.0", "hbm_gbps = 1e-320", "hbm_gbps"),  # was a NaN step
    ("bw_gbps = 12.5", "bw_gbps = 1e-320", "inter.bw_gbps"),  # was an infinite step
    ("peak_tflops = 100.0", "peak_tflops = 1e300", "peak_tflops"),  # was an MFU of 0
    ("gpus_per_node = 4", "gpus_per_node = 1e300", "gpus_per_node"),
    ("gpus_per_node = 4", "gpus_per_node = 8192", "gpus_per_node"),
    ("latency_us = 20", "latency_us = 2e6", "inter.latency_us"),
])
def test_implausible_numbers_are_refused(tmp_path, old, new, field):
    msg = _refusal(tmp_path, _toml_with(old, new))
    assert f"field {field} = " in msg and "plausible range" in msg


def test_notes_list_is_a_tuple_and_the_cluster_hashable():
    c = Cluster(name="t", peak_tflops=100.0, hbm_gib=80.0, hbm_gbps=2000.0, gpus_per_node=8,
                intra=Link("nvl", 300.0, 3.0), inter=Link("ib", 25.0, 10.0), notes=["a", "b"])
    assert c.notes == ("a", "b") and hash(c) == hash(c)


def test_estimate_refuses_a_step_that_is_not_finite():
    from dataclasses import replace

    from profiler.costmodel import NoStepError, estimate
    from profiler.layout import Layout, ModelSpec

    spec = ModelSpec(layers=2, hidden=64, heads=4, ffn=256, vocab=100, seq=16, global_batch=4)
    c = Cluster(name="t", peak_tflops=100.0, hbm_gib=80.0, hbm_gbps=2000.0, gpus_per_node=8,
                intra=Link("nvl", 300.0, 3.0), inter=Link("ib", 25.0, 10.0))
    # a hand-built cluster escapes the file bounds: 1e-320 GB/s HBM makes every memory-bound op inf
    with pytest.raises(NoStepError, match="no usable step"):
        estimate(spec, Layout(microbatch=4), replace(c, hbm_gbps=1e-320))
    assert estimate(spec, Layout(microbatch=4), c).step_s > 0


def test_link_that_is_not_a_table_is_refused(tmp_path):
    text = FULL_TOML.split("[intra]")[0] + 'intra = 5\n[inter]\nname = "x"\nbw_gbps = 1\nlatency_us = 1\n'
    msg = _refusal(tmp_path, text)
    assert "field intra must be a table" in msg


def test_toml_syntax_error_says_where(tmp_path):
    msg = _refusal(tmp_path, _toml_with("hbm_gib = 24", "hbm_gib = = 24"))
    assert "TOML syntax error" in msg and "line 3" in msg


def test_json_syntax_error_says_where(tmp_path):
    msg = _refusal(tmp_path, '{\n  "name": "x",\n  "peak_tflops": 1,,\n}', ".json")
    assert "JSON syntax error at line 3" in msg


@pytest.mark.parametrize("text", ["[1, 2]", '"h100"', "null"])
def test_json_that_is_not_an_object_is_refused(tmp_path, text):
    assert "top level must be a table" in _refusal(tmp_path, text, ".json")


def test_json_nan_is_refused(tmp_path):
    data = json.dumps(full_dict()).replace('"peak_tflops": 100.0', '"peak_tflops": NaN')
    assert "peak_tflops must be a finite number" in _refusal(tmp_path, data, ".json")


def test_json_huge_integer_is_refused(tmp_path):
    data = json.dumps(full_dict()).replace('"hbm_gbps": 900.0', '"hbm_gbps": 1' + "0" * 400)
    assert "hbm_gbps is too large" in _refusal(tmp_path, data, ".json")


def test_not_utf8_is_refused(tmp_path):
    p = tmp_path / "bin.toml"
    p.write_bytes(b"\xff\xfe\x00peak")
    with pytest.raises(ClusterError, match=r"bin\.toml: not UTF-8"):
        load_cluster(str(p))


def test_missing_file_lists_the_presets(tmp_path):
    p = tmp_path / "nope.toml"
    with pytest.raises(ClusterError) as e:
        load_cluster(str(p))
    assert str(p) in str(e.value) and "no such file" in str(e.value)
    assert "a100, b200, h100, h200, mi300x" in str(e.value)


def test_wrong_suffix_is_refused(tmp_path):
    p = tmp_path / "cluster.yaml"
    p.write_text("peak_tflops: 1\n")
    with pytest.raises(ClusterError, match=r"cluster\.yaml: not a \.toml or \.json file"):
        load_cluster(str(p))


def test_directory_named_toml_is_refused(tmp_path):
    d = tmp_path / "dir.toml"
    d.mkdir()
    with pytest.raises(ClusterError, match="not a regular file"):
        load_cluster(str(d))


def test_unknown_preset_suggests_the_nearest(tmp_path):
    with pytest.raises(ClusterError) as e:
        load_cluster("h1000")
    assert "no such preset (did you mean h100?)" in str(e.value)
    with pytest.raises(ClusterError, match="give a preset"):
        load_cluster("  ")


def test_cluster_from_dict_names_its_source():
    data = full_dict()
    data["peak_tflops"] = -1
    with pytest.raises(ClusterError, match=r"^cluster calibrated from run r1: field peak_tflops must be > 0"):
        cluster_from_dict(data, source="calibrated from run r1")
    with pytest.raises(ClusterError, match="top level"):
        cluster_from_dict([1], source="x")


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_preset_round_trips_through_a_json_file(tmp_path, name):
    c = load_cluster(name)
    p = tmp_path / f"{name}-copy.json"
    p.write_text(json.dumps(cluster_to_dict(c), indent=1))
    back = load_cluster(str(p))
    assert back == c and back.notes == c.notes
    assert back.source == str(p)  # where it came from is not part of equality
    assert cluster_from_dict(cluster_to_dict(c), source="x") == c


def test_constructed_cluster_round_trips(tmp_path):
    c = Cluster(name="calibrated", peak_tflops=0.1 + 0.2, hbm_gib=1 / 3, hbm_gbps=math.pi, gpus_per_node=2,
                intra=Link("shm", 1e-3, 0.0), inter=Link("tcp", 0.125, 55.5), gemm_efficiency=1.0,
                hbm_efficiency=1e-6, link_efficiency=0.5, hbm_reserve_gib=0.125)  # a reserve below the 1/3 GiB
    p = tmp_path / "c.json"
    p.write_text(json.dumps(cluster_to_dict(c)))
    assert load_cluster(str(p)) == c


def test_the_documented_example_file_loads(tmp_path):
    # docs/whatif.md, "Your own cluster": the example a user copies must be a valid file.
    doc = (REPO / "docs" / "whatif.md").read_text()
    block = doc.split("### Your own cluster", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    p = tmp_path / "my-cluster.toml"
    p.write_text(block)
    c = load_cluster(str(p))
    assert (c.name, c.gpus_per_node, c.intra.bw_gbps, c.inter.bw_gbps) == ("lab L40S", 4, 25.0, 12.5)
    assert c.link_efficiency == 0.8  # not given: the default


def test_hbm_reserve_field(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(FULL_TOML.replace("hbm_gib = 24", "hbm_gib = 24\nhbm_reserve_gib = 4"))
    c = load_cluster(str(p))
    assert c.hbm_reserve_gib == 4.0 and c.usable_hbm_bytes == 20 * 2**30
    assert load_cluster("h100").usable_hbm_bytes == int(79.65 * 2**30) - 2 * 2**30  # the 2 GiB default
    msg = _refusal(tmp_path, FULL_TOML.replace("hbm_gib = 24", "hbm_gib = 24\nhbm_reserve_gib = 24"))
    assert "hbm_reserve_gib = 24 leaves nothing" in msg
    msg = _refusal(tmp_path, FULL_TOML.replace("hbm_gib = 24", "hbm_gib = 24\nhbm_reserve_gib = -1"))
    assert "hbm_reserve_gib" in msg and ">= 0" in msg


# The README's lab cluster with the unit mistakes a new user makes: 100 GbE written as 100 (Gb/s,
# not GB/s), latency in seconds, HBM in MiB, HBM bandwidth in TB/s. All load; each is warned.
@pytest.mark.parametrize("old, new, words", [
    ("bw_gbps = 12.5", "bw_gbps = 100", "inter.bw_gbps = 100 GB/s is above intra.bw_gbps = 25 GB/s"),
    ("latency_us = 20", "latency_us = 14e-6", "inter.latency_us = 1.4e-05 µs is under 0.1 µs"),
    ("latency_us = 5.0", "latency_us = 0.05", "intra.latency_us = 0.05 µs is under 0.1 µs"),
    ("hbm_gib = 24", "hbm_gib = 48000", "hbm_gib = 48000 GiB per GPU is over 1024 GiB (MiB written for GiB?"),
    ("hbm_gbps = 900.0", "hbm_gbps = 0.864", "hbm_gbps = 0.864 GB/s for a 100 TFLOP/s peak is under 10 GB/s"),
])
def test_likely_unit_mistakes_load_with_a_warning(tmp_path, old, new, words):
    path = tmp_path / "lab.toml"
    path.write_text(_toml_with(old, new))
    warnings = cluster_warnings(load_cluster(str(path)))
    assert len(warnings) == 1 and words in warnings[0]
    path.write_text(FULL_TOML)
    assert cluster_warnings(load_cluster(str(path))) == []


def test_cpu_like_numbers_and_the_presets_raise_no_warning():
    # a CPU calibration: a few GB/s of memory, ms latencies, inter = intra (one link)
    link = Link("gloo", 3.0, 2000.0)
    cpu = Cluster("cpu", peak_tflops=0.2, hbm_gib=64, hbm_gbps=4.0, gpus_per_node=2, intra=link, inter=link)
    assert cluster_warnings(cpu) == []
    assert cluster_warnings(Cluster("zero latency", 100, 24, 900, 4, Link("a", 25, 0.0), Link("b", 12.5, 0.0), sms=100)) == []
    for name in preset_names():
        assert cluster_warnings(load_cluster(name)) == [], name


def test_project_and_plan_print_the_warnings_on_stderr(tmp_path, capsys):
    from profiler.cli_whatif import plan_main, project_main

    path = tmp_path / "lab.toml"
    path.write_text(_toml_with("bw_gbps = 12.5", "bw_gbps = 100"))
    assert project_main([str(REPO / "traces" / "sample-ddp-2r"), "--cluster", str(path)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ptprof project: warning: {path}: inter.bw_gbps = 100 GB/s is above intra.bw_gbps = 25 GB/s: "
                   "between nodes faster than inside one (Gb/s written for GB/s? 100 GbE is 12.5 GB/s)"]
    assert plan_main(["--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "32", "--global-batch", "4",
                      "--gpus", "2", "--cluster", str(path)]) == 0
    assert capsys.readouterr().err.startswith(f"ptprof plan: warning: {path}: inter.bw_gbps = 100 GB/s")


@pytest.mark.parametrize("spec", ["a100-40gb", "h100-pcie", "H100 NVL", "b100", "a10", "v100"])
def test_a_different_gpu_is_not_offered_a_preset(spec):
    # "did you mean a100?" for an A100 40GB would swap in 80 GB of HBM without a word
    with pytest.raises(ClusterError) as e:
        load_cluster(spec)
    msg = str(e.value)
    assert f"cluster {spec}: no such preset, and a different GPU from the presets (a100, b200, h100, h200, mi300x)" in msg
    assert "did you mean" not in msg and "write its numbers in a .toml file" in msg


@pytest.mark.parametrize("spec, stem", [("h10", "h100"), ("a10O", "a100"), ("h1000", "h100"), ("mi30x", "mi300x")])
def test_a_typo_of_a_preset_keeps_the_suggestion(spec, stem):
    with pytest.raises(ClusterError, match=rf"no such preset \(did you mean {stem}\?\)"):
        load_cluster(spec)


def test_a_gpu_without_an_sm_count_is_warned_of(tmp_path):
    """An L40S file without `sms` (the README's example had none) timed GEMMs with no wave
    quantization: a small model's compute projected 3x faster than on the H100 preset (trial)."""
    p = tmp_path / "c.toml"
    p.write_text(FULL_TOML.replace("sms = 100\n", ""))
    (w,) = cluster_warnings(load_cluster(str(p)))
    assert w.startswith("no sms (SMs per GPU) and not a preset's GPU: GEMMs are timed without wave quantization")
    assert cluster_warnings(replace(load_cluster(str(p)), name="my H100 box")) == []  # the name says its SMs
    # a cluster calibrated from a run (saved, then given back): its measured peak has the waves in it (review)
    assert cluster_warnings(replace(load_cluster(str(p)), name="measured:run1")) == []
    # the README's and docs/whatif.md's example files give it
    for doc in ("README.md", "docs/whatif.md"):
        block = (REPO / doc).read_text().split('name = "lab L40S"', 1)[1].split("```", 1)[0]
        assert "sms = 142" in block, doc
