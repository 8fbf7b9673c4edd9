"""Each dataset run records its data as MLflow dataset inputs: the dataset's name, the folder its
images come from and a digest per split, so the runs table's Dataset column and filter work and
two runs on the same few-shot draw can be told apart from runs on another."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_dataset_inputs_name_source_and_digest_of_each_split(tmp_path):
    from vacsr.config import Config
    from vacsr.data.digest import fingerprints
    from vacsr.data.generate import generate_all
    from vacsr.records import MlflowTracker
    from vacsr.records.inputs import log_dataset_inputs

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
