"""benchmarks/gpu_check.py on a machine without a GPU: one line that says so, exit 2, before
torch is imported (fast); with a device claimed, the script goes on to its checks."""

import subprocess
import sys

import pytest

from benchmarks import gpu_check


def test_without_a_gpu_it_says_so_in_one_line_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: False)
    assert gpu_check.main([]) == gpu_check.NO_GPU == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA device" in out


def test_the_no_gpu_path_imports_no_torch_where_there_is_no_driver():
    if gpu_check.cuda_available():
        pytest.skip("this machine has a CUDA device: the script would run its checks")
    code = ("import sys; from benchmarks import gpu_check; rc = gpu_check.main([]); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert len(r.stdout.strip().splitlines()) == 1


def test_with_a_gpu_claimed_it_goes_on_to_the_checks(monkeypatch, tmp_path):
    """The exit code 2 comes from the device check alone: with a device, the steps run (here
    stubbed: the plan step fails at once, the report is still written)."""
    import torch

    monkeypatch.setattr(gpu_check, "cuda_available", lambda: True)
    props = type("P", (), {"name": "stub", "total_memory": 80 * 2**30})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(gpu_check, "_run", lambda cmd, timeout: (1, "autopar: error: stubbed", 0.0))
    out = tmp_path / "gpu.md"
    assert gpu_check.main(["--out", str(out)]) == 0
    text = out.read_text()
    assert "Device: stub, 80.0 GiB" in text and text.count("`autopar plan` failed") == 2
