import subprocess
import sys

from conftest import refused


def _vacsr(*args):
    return subprocess.run([sys.executable, "-m", "vacsr.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_bad_override_is_one_line_error_and_exit_2(tmp_path):
    out = _vacsr("train", "loss.gamma=-1", f"train.output_dir={tmp_path}")
    assert refused(out) == "vacsr: error: loss.gamma: expected a finite weight >= 0, got -1.0"
    assert not any(tmp_path.iterdir())  # nothing written


def test_missing_config_file(tmp_path):
    out = _vacsr("train", "--config", str(tmp_path / "nope.yaml"))
    assert out.returncode == 2 and "nope.yaml: config file not found" in out.stderr
