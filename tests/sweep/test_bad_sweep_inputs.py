"""A sweep's bad inputs are refused before Ray starts: one line `vacsr: error: ...`, exit status
2, and nothing written, neither under --storage nor beside it. Also what a killed driver left
behind: its Ray instance is ended by the next start, and nothing else is."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, make_dataset_folders, refused, sweep_plan
from sweeps.base2novel import SWEEP as BASE2NOVEL
from tests.support.servers import answering, http_serving
from tests.support.sweep_refusals import sweep_refused as _refused
from tests.support.sweep_refusals import written_besides


def _nothing_written(tmp_path: Path, *kept: Path) -> None:
    written = written_besides(tmp_path, *kept)
    assert written == [], written


@pytest.mark.parametrize("name", ["../escaped", "<absolute>", "a/b", "line\nbreak", ".", "..",
                                  ".hidden", ""])
def test_a_sweep_name_must_be_one_safe_folder_name(tmp_path, capsys, name):
    name = name.replace("<absolute>", str(tmp_path / "abs-sweep"))
    line = _refused(["--name", name], tmp_path / "store", capsys)
    assert "--name" in line
    _nothing_written(tmp_path)


@pytest.fixture
def data_root(tmp_path) -> Path:
    return make_dataset_folders(tmp_path / "data")


def test_a_data_root_without_the_dataset_is_refused(tmp_path, capsys):
    (tmp_path / "data" / "eurosat").mkdir(parents=True)
    line = _refused(["--datasets", "eurosat,dtd", "--data-root", str(tmp_path / "data")],
                    tmp_path / "store", capsys)
    assert f"{tmp_path / 'data' / 'dtd'}: folder not found" in line
    _nothing_written(tmp_path, tmp_path / "data")


def test_a_missing_novel_test_image_of_a_later_dataset_is_refused_before_ray(tmp_path, capsys):
    """Trials read only base-class images; the final phase reads the novel test split. A missing
    one is named before the first trial, not after every dataset's search."""
    import json

    from vacsr.data.generate import generate_all

    data = generate_all(tmp_path / "data", datasets=["eurosat", "dtd"], per_class=(2, 1, 1))
    split_file = data / "dtd" / "split_zhou_DescribableTextures.json"
    novel = max(entry[1] for entry in json.loads(split_file.read_text())["test"])
    image = next(entry[0] for entry in json.loads(split_file.read_text())["test"]
                 if entry[1] == novel)
    (data / "dtd" / "images" / image).unlink()
    line = _refused(["--datasets", "eurosat,dtd", "--data-root", str(data), "--trials", "1",
                     "--seeds", "1"], tmp_path / "store", capsys)
    assert line == (f"vacsr: error: {data / 'dtd' / 'images' / image}: image file not found "
                    f"(listed in {split_file}); expected the image the split file names")
    _nothing_written(tmp_path, data)


def test_a_batch_its_few_shot_split_cannot_fill_is_refused_before_ray(tmp_path, capsys):
    """EuroSAT's 5 base classes at --shots 1 are 5 training images, fewer than the largest batch
    size its search draws (4, 5, 6; a fixed one alike): every trial that drew 6 would fail as it
    started. One line before Ray instead; a sweep whose batches fit goes on."""
    from vacsr.data.generate import generate_all

    data = generate_all(tmp_path / "data", datasets=["eurosat"], per_class=(2, 1, 1))
    too_few = ("vacsr: error: eurosat: the training split has 5 images at data.shots=1, fewer "
               "than one batch of train.batch_size=6{}, so its runs would take no training step; "
               "use more shots (--shots) or batches of at most 5 (--set train.batch_size=N)")
    argv = ["--datasets", "eurosat", "--data-root", str(data), "--shots", "1"]
    assert _refused(argv, tmp_path / "store", capsys) == too_few.format(" (searched: 4, 5, 6)")
    assert _refused([*argv, "--set", "train.batch_size=6"], tmp_path / "store",
                    capsys) == too_few.format("")
    _nothing_written(tmp_path, data)

    # planned without a refusal: 10 images at --shots 2, and a batch fixed at 5 of the 5
    sweep_plan(BASE2NOVEL, tmp_path / "ok", [*argv[:4], "--shots", "2"])
    assert sweep_plan(BASE2NOVEL, tmp_path / "ok", [*argv, "--set", "train.batch_size=5"]
                      ).configs["eurosat"].train.batch_size == 5


def test_the_embedded_profiles_batches_are_checked_against_the_data_it_would_write(
        tmp_path, capsys, monkeypatch):
    """Without --data-root the same check reads the sizes the profile's generator would write,
    before writing them: EuroSAT's 5 base classes at --shots 1, and an ImageNet whose base half
    at 2 shots is smaller than its largest searched batch (128)."""
    from vacsr.data.synthetic_layout import SyntheticSizes
    from vacsr.errors import ConfigError
    from vacsr.sweep.plan.embedded_profile import synthetic_train_counts
    from vacsr.sweep.plan.inputs import check_one_batch

    line = _refused(["--datasets", "eurosat", "--shots", "1"], tmp_path / "store", capsys)
    assert line.startswith("vacsr: error: eurosat: the training split has 5 images at "
                           "data.shots=1, fewer than one batch of train.batch_size=6")
    _nothing_written(tmp_path)

    plan = sweep_plan(BASE2NOVEL, tmp_path / "ok", ["--datasets", "imagenet,eurosat"],
                      monkeypatch=monkeypatch)
    shipped = plan.synthetic  # the profile's own sizes fit every searched batch
    check_one_batch(synthetic_train_counts(BASE2NOVEL, shipped, ["imagenet"]), plan.configs,
                    plan.spaces)
    small = SyntheticSizes(per_class=shipped.per_class, imagenet_classes=100)
    with pytest.raises(ConfigError, match=r"^imagenet: the training split has 100 images .*"
                                          r"train.batch_size=128 \(searched: 64, 128\)"):
        check_one_batch(synthetic_train_counts(BASE2NOVEL, small, ["imagenet"]), plan.configs,
                        plan.spaces)


def test_an_unknown_model_is_refused(tmp_path, capsys, data_root):
    line = _refused(["--datasets", "eurosat", "--data-root", str(data_root), "--model",
                     "ViT-Q-99"], tmp_path / "store", capsys)
    assert "--model: unknown open_clip model 'ViT-Q-99'" in line
    _nothing_written(tmp_path, data_root)


@pytest.mark.parametrize("kind", ["missing", "text", "empty"])
def test_a_pretrained_that_is_missing_or_not_weights_is_refused(tmp_path, capsys, data_root,
                                                                 kind):
    path = tmp_path / "weights.pt"
    if kind == "text":
        path.write_text("model: ViT-B-32\n")
    elif kind == "empty":
        path.write_bytes(b"")
    line = _refused(["--datasets", "eurosat", "--data-root", str(data_root), "--pretrained",
                     str(path)], tmp_path / "store", capsys)
    assert str(path) in line
    assert ("no such weights file" if kind == "missing" else "is not weights") in line
    _nothing_written(tmp_path, data_root, path)


def test_an_unreachable_ray_address_fails_within_a_bounded_wait(tmp_path, capsys, data_root):
    start = time.monotonic()
    line = _refused(["--datasets", "eurosat", "--data-root", str(data_root), "--ray-address",
                     "127.0.0.1:9"], tmp_path / "store", capsys)
    assert time.monotonic() - start < 30
    assert "--ray-address 127.0.0.1:9: no Ray cluster reachable there" in line
    _nothing_written(tmp_path, data_root)


def test_the_dashboard_flag_with_a_cluster_address_is_refused(tmp_path, capsys, data_root):
    line = _refused(["--datasets", "eurosat", "--data-root", str(data_root), "--ray-address",
                     "127.0.0.1:9", "--ray-dashboard"], tmp_path / "store", capsys)
    assert "--ray-dashboard with --ray-address 127.0.0.1:9: the dashboard is the local" in line
    _nothing_written(tmp_path, data_root)


def test_a_draw_slack_with_free_running_is_refused(tmp_path, capsys, data_root):
    line = _refused(["--datasets", "eurosat", "--data-root", str(data_root), "--free-running",
                     "--draw-slack", "1"], tmp_path / "store", capsys)
    assert "--draw-slack 1 with --free-running: the slack paces the deterministic" in line
    _nothing_written(tmp_path, data_root)


@pytest.mark.parametrize("argv,fragment", [
    (["--set", "train.device=cuda"], "cuda asked for, but no GPU is reserved"),
    (["--set", "train.device=cuda:1", "--gpus-per-worker", "1"], "names a device index"),
])
def test_a_device_the_runs_cannot_have_is_refused(tmp_path, capsys, data_root, argv, fragment):
    line = _refused(["--datasets", "eurosat", "--data-root", str(data_root), *argv],
                    tmp_path / "store", capsys)
    assert fragment in line
    _nothing_written(tmp_path, data_root)


@pytest.mark.parametrize("text, fragment", [
    ("model.trainable_side=choice:bogus", "model.trainable_side of eurosat can draw 'bogus'"),
    ("model.trainable_side=choice:last,bogus", "can draw 'bogus'"),
    ("train.epochs=int:-3:2", "train.epochs of eurosat can draw -3"),
])
def test_search_range_values_are_checked_before_ray_starts(tmp_path, capsys, data_root, text,
                                                           fragment):
    line = _refused(["--datasets", "eurosat", "--data-root", str(data_root), "--range", text],
                    tmp_path / "sweeps", capsys)  # Ray not started: _refused checks it
    assert fragment in line
    assert not (tmp_path / "sweeps" / "base2novel" / "tune").exists()

@pytest.mark.parametrize("argv, fragment", [
    (["--set", "loss.beta=0.5", "--range", "loss.beta=log:0.1:1"],
     "--range loss.beta: --set fixes it, and a fixed key is never searched; give one of the two"),
    (["--range", "optim.schedule=choice:cosine,step"],  # base-to-novel's protocol: cosine
     "--range optim.schedule: the base2novel protocol fixes it (paper appendix C.2)"),
])
def test_a_range_on_a_fixed_key_is_one_line(tmp_path, capsys, data_root, argv, fragment):
    line = _refused(["--datasets", "eurosat", "--data-root", str(data_root), *argv],
                    tmp_path / "store", capsys)
    assert fragment in line
    _nothing_written(tmp_path, data_root)


# ---------------------------------------------------------------- --resume of a damaged folder
def _resume_refused(tmp_path, capsys, data_root) -> tuple[str, Path]:
    root = tmp_path / "store" / "base2novel"
    line = _refused(["--datasets", "eurosat", "--data-root", str(data_root), "--resume"],
                    tmp_path / "store", capsys)
    return line, root


@pytest.mark.parametrize("content,fragment", [
    ("[1, 2]", "a JSON list, not an object"),
    ('"state"', "a JSON str, not an object"),
    ('{"settings": [1]}', "'settings' is a list"),
    ('{"datasets": {"eurosat": {"done": true}}}', "done without its per-seed results"),
    ('{"datasets": {"eurosat": {"run_id": 5}}}', "'eurosat.run_id' is a int"),
    ("{not json", "not valid JSON"),
])
def test_a_damaged_sweep_state_stops_the_resume_in_one_line(tmp_path, capsys, data_root,
                                                            content, fragment):
    state = tmp_path / "store" / "base2novel" / "sweep_state.json"
    state.parent.mkdir(parents=True)
    state.write_text(content)
    line, _ = _resume_refused(tmp_path, capsys, data_root)
    assert f"{state}: " in line and fragment in line
    assert state.read_text() == content


def test_a_resume_without_its_sweep_state_is_refused_where_the_studies_remain(tmp_path, capsys,
                                                                              data_root):
    """Read as a new sweep, it would open the sweep's and datasets' MLflow runs twice."""
    import optuna

    root = tmp_path / "store" / "base2novel"
    root.mkdir(parents=True)
    optuna.create_study(study_name="base2novel-eurosat", storage=f"sqlite:///{root}/optuna.db")
    # Optuna's line about the new study, where its log handler was made under this capture
    capsys.readouterr()
    line, _ = _resume_refused(tmp_path, capsys, data_root)
    assert f"{root / 'sweep_state.json'} is missing" in line and "base2novel-eurosat" in line
    assert not (root / "sweep_state.json").exists()


@pytest.mark.parametrize("where", ["tune/eurosat-0123456789ab/experiment_state-2026-12-02.json",
                                   "trials/eurosat/selection.json"])
def test_a_damaged_tune_state_or_selection_record_stops_the_resume(tmp_path, capsys, data_root,
                                                                   where):
    """The dataset's Tune experiment is named by its MLflow run's id (folders.tune_experiment)."""
    root = tmp_path / "store" / "base2novel"
    damaged = root / where
    damaged.parent.mkdir(parents=True)
    damaged.write_text('{"trials": [')
    (root / "sweep_state.json").write_text(
        '{"format": 3, "datasets": {"eurosat": {"run_id": "0123456789abcdef"}}}')
    line, _ = _resume_refused(tmp_path, capsys, data_root)
    assert str(damaged) in line
    assert damaged.read_text() == '{"trials": ['


def test_a_tracking_server_that_refuses_the_credentials_is_one_line(tmp_path, capsys, data_root,
                                                                    monkeypatch):
    """A wrong password (HTTP 401): one line naming the redacted URI and where MLflow reads
    credentials from, before Ray starts and before the sweep folder is written."""
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
                 "MLFLOW_TRACKING_AUTH", "MLFLOW_TRACKING_AWS_SIGV4"):
        monkeypatch.delenv(name, raising=False)
    refused = b'{"error_code": "UNAUTHENTICATED", "message": "wrong credentials"}'
    with http_serving(answering(401, "application/json", refused)) as uri:
        given = uri.replace("//", "//alice:s3cret@")
        line = _refused(["--datasets", "eurosat", "--data-root", str(data_root),
                         "--tracking-uri", given], tmp_path / "store", capsys)
    assert "the server refused the credentials (HTTP 401" in line and "s3cret" not in line
    assert "alice:***@" in line and "MLFLOW_TRACKING_PASSWORD" in line
    _nothing_written(tmp_path, data_root)


@pytest.mark.parametrize("carrying, secret", [
    ("s3://AKIAEXAMPLE:{s}@bucket/x?region=us-east-1&bogus=1", "wJalrXUtnFEMIK7MDENG"),
    ("s3://bucket/x?region=us-east-1&secret_access_key={s}&bogus=1", "wJalrXUtnFEMIK7MDENG"),
    ("foo://AKIAEXAMPLE:{s}@bucket/x", "wJalrXUtnFEMIK7MDENG"),  # pyarrow quotes the URI back
    ("foo://bucket/x#access_token={s}", "ya29.a0AfB_byC"),
])
def test_ray_storage_credentials_never_reach_the_refusal_line(tmp_path, capsys, data_root,
                                                              carrying, secret):
    """Refused before any network access (an unexpected query parameter, an unknown scheme)."""
    line = _refused(["--datasets", "eurosat", "--data-root", str(data_root), "--ray-storage",
                     carrying.format(s=secret)], tmp_path / "store", capsys)
    assert line.startswith("vacsr: error: --ray-storage ") and "***" in line
    assert secret not in line + capsys.readouterr().out
    _nothing_written(tmp_path, data_root)


def test_a_token_after_the_tracking_uris_hash_never_reaches_the_refusal_line(tmp_path, capsys,
                                                                            data_root):
    with http_serving(answering(200, "text/html", b"<html>not mlflow</html>")) as uri:
        line = _refused(["--datasets", "eurosat", "--data-root", str(data_root),
                         "--tracking-uri", f"{uri}/#access_token=ya29.tok3n&expires_in=3599"],
                        tmp_path / "store", capsys)
    assert f"{uri}/#access_token=***&expires_in=3599: answered, but not as an MLflow" in line
    assert "ya29.tok3n" not in line + capsys.readouterr().out
    _nothing_written(tmp_path, data_root)


# ---------------------------------------------------------------- --plan-out's file
@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_plan_out_onto_a_copy_of_dev_null_is_refused_and_left_a_device(tmp_path):
    """The sweep script itself: refused before the plan is measured, the node untouched."""
    target = tmp_path / "null"
    os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    out = subprocess.run([sys.executable, "sweeps/base2novel.py", "--plan", "--plan-out",
                          str(target), "--storage", str(tmp_path / "store")], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                         text=True, timeout=240)
    assert refused(out) == (f"vacsr: error: --plan-out {target.resolve()}: cannot write (it is "
                            "a character device); expected a path to a regular file or to none "
                            "yet")
    assert out.stdout == ""  # no plan printed: nothing was measured
    assert stat.S_ISCHR(os.lstat(target).st_mode) and os.lstat(target).st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


@pytest.mark.parametrize("place", ["folder", "read-only folder"])
def test_plan_out_onto_a_folder_or_into_a_read_only_one_is_one_line(tmp_path, capsys, read_only,
                                                                   place):
    if place == "folder":
        target = tmp_path / "plan.json"
        target.mkdir()
        start, end = f"{target}: cannot write (it is a folder)", "or to none yet"
    else:
        folder = tmp_path / "ro"
        folder.mkdir()
        target = read_only(folder) / "plan.json"
        start, end = f"{folder}: cannot write (", "expected a writable folder for --plan-out"
    line = _refused(["--plan", "--plan-out", str(target)], tmp_path / "store", capsys)
    assert line.startswith(f"vacsr: error: --plan-out {start}") and line.endswith(end), line
    assert capsys.readouterr().out == ""  # refused before the plan is measured
    assert not (tmp_path / "store").exists() and not (tmp_path / "ro" / "plan.json").exists()


# ---------------------------------------------------------------- what a killed driver left
_DRIVER = """
import os, signal, subprocess, sys, time
from vacsr.distributed.leftovers import new_temp_dir, record_instance
child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
time.sleep(0.3)
temp = new_temp_dir()
(temp / "pymp-left").mkdir()  # what the instance's processes left in their TMPDIR
record_instance(sys.argv[1], temp)
print(child.pid, temp, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="process start times come from /proc")
def test_a_dead_drivers_instance_is_ended_and_nothing_else(tmp_path, monkeypatch):
    """Real processes: a 'driver' records its SIGTERM-ignoring child as its instance, is
    SIGKILLed, and the next start ends the child and removes the instance's temporary folder; a
    live driver's record is left alone."""
    from vacsr.distributed import leftovers

    monkeypatch.setenv("VACSR_CACHE_DIR", str(tmp_path / "cache"))
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, str(tmp_path / "session_dead")],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd(),
                                   "TMPDIR": str(tmp_path)})
    try:
        pid, temp = driver.stdout.readline().split()
        child, temp = int(pid), Path(temp)
        assert leftovers.reap_dead_instances() == []  # its driver runs: not touched
        assert leftovers.start_time(child) is not None and (temp / "pymp-left").is_dir()
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
        live = leftovers.record_instance(str(tmp_path / "session_live"))  # this process: alive
        started = time.monotonic()
        assert leftovers.reap_dead_instances() == [child]
        assert leftovers.start_time(child) is None and time.monotonic() - started < 5
        assert temp.parent == tmp_path and not temp.exists()
        assert sorted(p.name for p in (tmp_path / "cache" / "ray-instances").iterdir()) == [
            live.name]
    finally:
        driver.kill()
        driver.wait(timeout=10)

