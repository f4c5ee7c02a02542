"""The examples as a user starts them: ``torchrun --standalone --nproc-per-node 2 examples/...``.

Each example compares its own losses with a single-process run and exits non-zero when they
differ; the test also reads the sharded column and checks it against its own single-process run.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import autopar
from autopar.cli.training import single_process_losses

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")

CASES = {
    "train_gpt.py": ("gpt", dict(layers=2, width=64, heads=4, seq=32, batch=8, vocab=256)),
    "train_cnn.py": ("cnn", dict(batch=4, channels=256, image=8, blocks=2, classes=10)),
}
# each example's plan as its docstring describes it: (module, split) rows of the printed report
SPLITS = {"train_gpt.py": [],
          "train_cnn.py": [("blocks.0.conv1", "c_out/2"), ("blocks.0.conv2", "c_in/2")]}


@pytest.mark.parametrize("script", sorted(CASES))
def test_example_trains_on_two_processes_like_one(script):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(ROOT / "examples" / script),
                        "--steps", "2"], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "predicted step time" in r.stdout and "equal" in r.stdout
    for node, split in SPLITS[script]:
        assert re.search(rf"^{re.escape(node)}\s+\S+\s+{re.escape(split)}\s", r.stdout, flags=re.M), \
            f"{script}'s plan does not split {node} as {split}:\n{r.stdout[:3000]}"
    sharded = [float(m) for m in re.findall(r"^\s*\d+\s+(-?\d+\.\d+)\s+-?\d+\.\d+\s+\S+$", r.stdout, flags=re.M)]
    name, sizes = CASES[script]
    model, inputs = autopar.zoo.get(name, **sizes)
    assert sharded == pytest.approx(single_process_losses(model, inputs, 2), rel=1e-5)


@pytest.mark.slow
def test_the_hugging_face_example_trains_gpt2_on_two_processes_like_one():
    pytest.importorskip("transformers")  # the test extra
    sys.path.insert(0, str(ROOT / "examples"))
    from train_hf_gpt2 import model_and_batch

    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2",
                        str(ROOT / "examples" / "train_hf_gpt2.py"), "--steps", "2"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    sharded = [float(m) for m in re.findall(r"^\s*\d+\s+(-?\d+\.\d+)\s+-?\d+\.\d+\s+\S+$", r.stdout, flags=re.M)]
    model, batch = model_and_batch()
    assert sharded == pytest.approx(single_process_losses(model, (), 2, kwargs=batch), rel=1e-5)
