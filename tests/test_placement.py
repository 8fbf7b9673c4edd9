"""The shared placement-group cleaner: a killed run's group is removed, a live or finished run's
group is left alone, and a trial's trainer registers with it instead of starting a cleaner actor
of its own."""
from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def ray_local():
    import ray

    from vacsr.distributed.cluster import ensure_ray

    ensure_ray(num_cpus=2)
    yield ray
    ray.shutdown()


def _state(group) -> str:
    from ray.util.placement_group import placement_group_table

    return placement_group_table(group)["state"]


def _wait_for(predicate, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


def test_dead_owner_group_removed_live_and_unregistered_kept(ray_local):
    ray = ray_local
    from ray.util.placement_group import placement_group, remove_placement_group

    from vacsr.distributed.placement import start_cleaner

    cleaner = start_cleaner()
    assert start_cleaner()._actor_id == cleaner._actor_id  # one per Ray instance

    @ray.remote(num_cpus=0)
    class Owner:  # stands in for a Tune trial actor running a Train controller
        def make_group(self, register: bool):
            group = placement_group([{"CPU": 0.1}])
            ray.get(group.ready())
            me = ray.get_runtime_context().get_actor_id()
            if register:
                ray.get(cleaner.register.remote(me, group))
            return me, group

    killed, live, finished = Owner.remote(), Owner.remote(), Owner.remote()
    killed_id, killed_group = ray.get(killed.make_group.remote(True))
    live_id, live_group = ray.get(live.make_group.remote(True))
    finished_id, finished_group = ray.get(finished.make_group.remote(True))
    ray.get(cleaner.unregister.remote(finished_id))  # ended normally: its run removes the group
    assert set(ray.get(cleaner.tracked.remote())) == {killed_id, live_id}

    ray.kill(killed)
    ray.kill(finished)
    assert _wait_for(lambda: _state(killed_group) == "REMOVED"), "the killed run's group leaked"
    assert ray.get(cleaner.removed.remote()) == [killed_id]
    time.sleep(5)  # two more rounds: nothing else goes
    assert _state(live_group) == "CREATED" and _state(finished_group) == "CREATED"
    assert set(ray.get(cleaner.tracked.remote())) == {live_id}
    for group in (live_group, finished_group):
        remove_placement_group(group)


def test_trial_trainer_uses_the_shared_cleaner(ray_local, tmp_path):
    ray = ray_local
    from vacsr.distributed.placement import start_cleaner

    start_cleaner()

    @ray.remote(num_cpus=0)
    class Trial:  # where a Tune trial builds its trainer
        def callbacks(self, output_dir: str) -> list[str]:
            from vacsr.config import load_config
            from vacsr.distributed.train import build_torch_trainer

            trainer = build_torch_trainer(load_config(overrides=[f"train.output_dir={output_dir}"]))
            return [type(c).__name__ for c in trainer._create_default_callbacks()]

    names = ray.get(Trial.remote().callbacks.remote(str(tmp_path)))
    assert "SharedCleanerCallback" in names and "PlacementGroupCleanerCallback" not in names
    assert "DatasetsCallback" not in names and "BackendSetupCallback" in names
