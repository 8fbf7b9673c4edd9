"""Each dataset run records its data as MLflow dataset inputs: the dataset's name, the folder its
images come from and a digest per split, so the runs table's Dataset column and filter work and
two runs on the same few-shot draw can be told apart from runs on another."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_dataset_inputs_name_source_and_digest_of_each_split(tmp_path):
    from vacsr.config import Config
    from vacsr.data.generate import generate_all
    from vacsr.records import MlflowTracker
    from vacsr.records.inputs import fingerprints, log_dataset_inputs

    root = generate_all(tmp_path / "data", datasets=["eurosat"], per_class=(4, 3, 2))
    config = Config()
    config.data.task, config.data.dataset, config.data.root = "classification", "eurosat", str(root)
    config.data.shots = 2
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = tracker.start("vacsr-base2novel", "eurosat", tags={"vacsr.dataset": "eurosat"})
    prints = log_dataset_inputs(tracker, config)
    tracker.finish()

    inputs = tracker.client.get_run(run_id).inputs.dataset_inputs
    contexts = {i.tags[0].value: i.dataset for i in inputs}
    assert sorted(contexts) == ["test", "train", "validation"]
    for split in prints:
        recorded = contexts[{"val": "validation"}.get(split.split, split.split)]
        assert recorded.name == "eurosat" and recorded.digest == split.digest
        assert str(root / "eurosat" / "2750") in recorded.source  # the images' folder
    # the UI's Dataset filter is a search on these fields
    found = tracker.client.search_runs(
        [tracker.experiment_id("vacsr-base2novel")],
        filter_string=f"dataset.name = 'eurosat' and dataset.digest = '{prints[0].digest}'")
    assert [r.info.run_id for r in found] == [run_id]

    # another seed draws other few-shot images (train, val) from the same test split
    other = {p.split: p.digest for p in fingerprints(config.data, seed=2)}
    mine = {p.split: p.digest for p in prints}
    assert other["train"] != mine["train"] and other["val"] != mine["val"]
    assert other["test"] == mine["test"]


def test_a_run_records_the_shots_its_classes_got_when_fewer_than_asked(tmp_path, weights,
                                                                        capsys):
    """data.shots=16 on 3 training images per class trains on the 3 (CoOp's sampling): the run's
    tags say so beside the param that records what was asked, and the console once."""
    from mlflow import MlflowClient

    from conftest import tracked_train
    from vacsr.data.generate import generate_all

    root = generate_all(tmp_path / "data", datasets=["eurosat"], per_class=(3, 1, 1))
    err = tracked_train(tmp_path, weights, capsys, "data.task=classification",
                        "data.dataset=eurosat", f"data.root={root}", "data.shots=16",
                        "data.subsample_classes=base", "model.use_gpo=false",
                        "train.batch_size=4")
    assert [line for line in err.splitlines() if "data.shots" in line] == [
        "vacsr: note: eurosat: data.shots=16, but a class with fewer training images trains on "
        "all of them: 3 to 3 per class (tags vacsr.shots_min / vacsr.shots_max)"]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("vacsr-train").experiment_id])
    assert run.data.params["data.shots"] == "16"
    assert (run.data.tags["vacsr.shots_min"], run.data.tags["vacsr.shots_max"]) == ("3", "3")


def test_a_sweep_says_once_before_ray_when_classes_have_fewer_shots(tmp_path, capsys):
    from conftest import sweep_plan
    from sweeps.base2novel import SWEEP as BASE2NOVEL

    sweep_plan(BASE2NOVEL, tmp_path / "store", ["--datasets", "eurosat,dtd", "--shots", "2"],
               data=tmp_path / "data")
    assert capsys.readouterr().out == ""  # two training images per class: 2 shots are all there
    sweep_plan(BASE2NOVEL, tmp_path / "store", ["--datasets", "eurosat,dtd", "--shots", "1000"],
               data=tmp_path / "data")
    assert capsys.readouterr().out.splitlines() == [
        f"{name}: data.shots=1000, but a class with fewer training images trains on all of them: "
        "2 to 2 per class (each run's tags vacsr.shots_min / vacsr.shots_max)"
        for name in ("eurosat", "dtd")]
