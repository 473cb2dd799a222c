"""Which results file the measured policy takes (mlactl/results/measured.py): a run tune wrote on
a CPU is found for the CPU's hardware profile, with its cache dtype or with none asked, and never
for another cache dtype or another device."""

import json

from conftest import cpu_results


def test_cpu_results_match_the_cpu_profile(tmp_path, home):
    from mlactl.results import measured

    (home / "hardware").mkdir(parents=True)
    (home / "hardware" / "cpu.toml").write_text(
        'name = "cpu"\nmatch = ["cpu"]\nmemory_gb = 16\nbandwidth_tbs = 0.02\n[peak_tflops]\nfp32 = 0.2\n'
    )
    folder = tmp_path / "runs"
    folder.mkdir()
    data = cpu_results(device={"name": "cpu", "type": "cpu", "hardware": None})
    (folder / "run.json").write_text(json.dumps(data))
    dims = {k: data["model"][k] for k in measured.DIMS}
    assert measured.find(dims, None, "cpu", folder)[1] == folder / "run.json"
    assert measured.find(dims, "fp32", "cpu", folder)[1] == folder / "run.json"
    assert measured.find(dims, "bf16", "cpu", folder)[0] is None
    assert measured.find(dims, None, "h800", folder)[0] is None
