"""A sweep's inputs checked before Ray starts and before anything is written: each bad value is
one line (ConfigError / DataError) and exit status 2, instead of a Ray instance whose every
trial fails on it, or a driver that waits for a cluster that is not there.
"""
from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from vacsr.errors import ConfigError
from vacsr.redact import redact_text, redact_uri
from vacsr.sweep.plan.folders import storage_filesystem

# a sweep name is one folder under --storage and part of Optuna study and MLflow run names
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
NAME_EXPECTED = ("one folder name of letters, digits, '.', '_' or '-' (at most 100, starting "
                 "with a letter or digit)")
RAY_CONNECT_TIMEOUT_S = 10.0  # to open a TCP connection to --ray-address's head node


def check_sweep_name(text: str) -> str:
    """--name: one safe path component (no '/', '..', newline or leading dot), so the sweep's
    folder, lock and databases stay under --storage."""
    if not NAME_PATTERN.fullmatch(text):
        raise ValueError(f"expected {NAME_EXPECTED}, got {text!r}")
    return text


def check_model(name: str) -> None:
    """An open_clip model name: a config file vacsr or open_clip ships is read without
    importing open_clip."""
    from vacsr.model.configs import model_config

    if model_config(name) is not None or name.startswith("hf-hub:"):
        return
    import open_clip

    if name not in open_clip.list_models():
        raise ConfigError(f"--model: unknown open_clip model {name!r} (open_clip.list_models() "
                          "names the known ones)")


def check_pretrained(text: str, model: str) -> None:
    """--pretrained: a readable weights file, or an open_clip tag of `model`."""
    from vacsr.model.configs import own_model_config
    from vacsr.model.weights import check_weights_file

    path = Path(text).expanduser()
    if path.is_file():
        check_weights_file(path)
        return
    if path.exists() or own_model_config(model) is not None or "/" in text or \
            path.suffix in (".pt", ".pth", ".bin", ".safetensors"):
        raise ConfigError(f"--pretrained {text}: no such weights file (vacsr's own models "
                          "have no open_clip tags)")
    import open_clip

    tags = open_clip.list_pretrained_tags_by_model(model)
    if text not in tags:
        raise ConfigError(f"--pretrained {text!r}: neither a weights file nor an open_clip tag "
                          f"of {model} (tags: {', '.join(tags) or 'none'})")


def check_datasets(root: Path, task: str, names: list[str]) -> dict[str, dict[int, int]]:
    """Each dataset's folder is where its layout puts it under --data-root, and every image any
    phase of the sweep reads is there: a classification run loads only its subsample, and a
    missing image of a later phase would otherwise end the dataset after its trials. Returns
    each classification dataset's training images per label."""
    from vacsr.data.checked_io import require_dir

    require_dir(root, "--data-root: the folder holding the datasets")
    if task == "retrieval":
        from vacsr.data.coco import check_coco_files

        for name in names:
            require_dir(root / name, f"the {name} layout (--data-root {root})")
        check_coco_files(root)  # the only retrieval layout (vacsr.data.RETRIEVAL_DATASETS)
        return {}
    from vacsr.data.classification import DATASETS, check_dataset_files

    for name in names:
        require_dir(root / DATASETS[name].folder,
                    f"the {name} dataset folder under --data-root (CoOp's DATASETS.md layout)")
    counts = {name: check_dataset_files(root, name) for name in names}  # a listdir per folder
    return {name: per_label for name, per_label in counts.items() if per_label}


def _shots_taken(per_label: dict[int, int], config) -> list[int]:
    """The training images each class of a unit's runs takes: data.shots, or all of a class's
    images where it has fewer (CoOp's sampling), over the classes the runs train on."""
    from vacsr.data.fewshot import subsample_labels

    shots = config.data.shots
    return [min(per_label[label], shots)
            for label in subsample_labels(per_label, config.data.subsample_classes)]


def note_fewer_shots(train_counts: dict[str, dict[int, int]], configs: dict) -> None:
    """One line per dataset where a class the runs train on has fewer training images than
    data.shots: it trains on all of them (CoOp's sampling), while the config records the shots
    asked for; each run's tags record those it got (vacsr/tasks.py run_tags)."""
    if not train_counts:  # the embedded profile, retrieval: and no data stack imported for it
        return
    from vacsr.task_names import SHOTS_MAX_TAG, SHOTS_MIN_TAG

    for dataset, config in configs.items():
        per_label, shots = train_counts.get(dataset), config.data.shots
        if not per_label:
            continue
        taken = _shots_taken(per_label, config)
        if min(taken) < shots:
            print(f"{dataset}: data.shots={shots}, but a class with fewer training images trains "
                  f"on all of them: {min(taken)} to {max(taken)} per class (each run's tags "
                  f"{SHOTS_MIN_TAG} / {SHOTS_MAX_TAG})", flush=True)


def check_one_batch(train_counts: dict[str, dict[int, int]], configs: dict,
                    spaces: dict) -> None:
    """Every batch size a unit's runs may train with fills its few-shot training split at least
    once. A run refuses one that does not (vacsr/data/sampler.py: the epoch would take no step),
    but only as it starts: every trial that drew it would fail, and with a fixed size every
    trial, final seed and method after the sweep had started. One line now instead."""
    from vacsr.config.domains import Choice
    from vacsr.methods.registry import method_of

    for unit, config in configs.items():
        per_label = train_counts.get(config.data.dataset)
        if not per_label or not method_of(config.adapter.kind).trained:
            continue
        images = sum(_shots_taken(per_label, config))
        domain = spaces.get(unit, {}).get("train.batch_size")
        sizes = (domain.options if isinstance(domain, Choice) else (int(domain.high),)
                 if domain is not None else (config.train.batch_size,))
        too_large = sorted(size for size in sizes if size > images)
        if too_large:
            drawn = f" (searched: {', '.join(map(str, sizes))})" if domain is not None else ""
            raise ConfigError(
                f"{unit}: the training split has {images} images at data.shots="
                f"{config.data.shots}, fewer than one batch of train.batch_size={too_large[-1]}"
                f"{drawn}, so its runs would take no training step; use more shots (--shots) "
                f"or batches of at most {images} (--set train.batch_size=N)")


def check_devices(configs: dict, local: bool, trial_cpus: float = 1.0) -> None:
    """train.device against the GPUs the runs reserve: under Ray a worker computes on the GPU
    Ray assigns it, so cuda needs --gpus-per-worker; a local instance has the GPUs torch sees,
    and must hold one trial (check_trials_fit)."""
    from vacsr.compute_device import parse_device

    for dataset, config in configs.items():
        spec, gpus = parse_device(config.train.device), config.train.gpus_per_worker
        if spec.index is not None:
            raise ConfigError(f"train.device: {spec} names a device index, but under Ray each "
                              "worker trains on the GPU Ray assigns it; use auto or cuda")
        if spec.kind == "cuda" and gpus <= 0:
            raise ConfigError("train.device: cuda asked for, but no GPU is reserved for the "
                              "runs; set --gpus-per-worker > 0, or train.device=auto or cpu")
        if gpus > 0 and local:
            import torch

            if not torch.cuda.is_available():
                raise ConfigError(f"--gpus-per-worker {gpus:g}: the local Ray instance would have "
                                  "no GPU (torch finds no CUDA device on this machine); join a "
                                  "cluster with --ray-address, or use --gpus-per-worker 0")
    if local:  # no autoscaler adds a node to a local instance
        check_trials_fit(configs, trial_cpus)


def check_trials_fit(configs: dict, trial_cpus: float) -> None:
    """A local instance has this machine's CPUs and GPUs and no autoscaler: a trial needing more
    would wait forever. Refused here, naming the flag."""
    from vacsr.sweep.plan.plan import local_resources, short_of, trial_needs

    have = local_resources(any(config.train.gpus_per_worker > 0 for config in configs.values()))
    for config in configs.values():
        train = config.train
        for name, (need, held) in short_of(trial_needs(train, trial_cpus), have).items():
            flag = "--cpus-per-worker" if name == "CPU" else "--gpus-per-worker"
            given = train.cpus_per_worker if name == "CPU" else train.gpus_per_worker
            raise ConfigError(f"{flag} {given:g}: one trial needs {need:g} {name}s "
                              f"({train.workers} worker(s)"
                              f"{'' if train.workers == 1 else ' and the trial driver'}), the "
                              f"local Ray instance has {held:g} (this machine's); lower it, or "
                              "join a cluster with --ray-address")


def check_ray_address(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """A head node answers at `address` (host:port or ray://host:port) within `timeout_s`:
    ray.init waits much longer for a cluster that is not there. "auto" and "local" pass."""
    if address in ("auto", "local"):
        return
    target = address.split("://", 1)[-1].rstrip("/")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--ray-address {address!r}: expected host:port or ray://host:port "
                          "(or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ConfigError(f"--ray-address {address}: no Ray cluster reachable there ({why} "
                          f"within {timeout_s:g} s); start it, or check RAY_ADDRESS") from None
    refusal = None if "://" in address else _token_refusal(f"{host}:{port}", timeout_s)
    if refusal:
        raise ConfigError(f"--ray-address {address}: {refusal}; set RAY_AUTH_MODE=token and the "
                          "cluster's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
                          "~/.ray/auth_token), as on its nodes")


# A GCS call every head answers (Ray >= 2.52 checks the token on it first); its reply is not
# read: only a refusal of the token counts, any other answer leaves the judgement to ray.init
_GCS_PROBE = "/ray.rpc.NodeInfoGcsService/GetClusterId"


def _ray_auth_token() -> str | None:
    """The token Ray sends (docs.ray.io, "Ray token authentication"): none unless
    RAY_AUTH_MODE=token, then RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names, or
    ~/.ray/auth_token, in that order ("" where none of them holds one)."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return None
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _token_refusal(target: str, timeout_s: float) -> str | None:
    """Why the head node at `target` (its GCS) refuses this process, or None: ray.init would
    retry for about 20 s, then fail with a traceback."""
    import grpc  # Ray's own dependency

    token = _ray_auth_token()
    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(_GCS_PROBE, request_serializer=lambda data: data,
                                   response_deserializer=lambda data: data)
        try:
            call(b"", timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                return ("the cluster refuses this machine's Ray auth token" if token else
                        "the cluster asks for a Ray auth token, and this machine sends none")
    return None


def check_ray_storage(text: str | None) -> str:
    """A URI pyarrow can open (s3://, gs://, file://...) as given; a path made absolute."""
    if text is None:
        return ""
    if "://" not in text:
        return str(Path(text).expanduser().resolve())
    try:
        storage_filesystem(text)
    except Exception as exc:  # pyarrow raises ArrowInvalid / ValueError / OSError by scheme
        why = redact_text(str(exc).splitlines()[0], text)  # pyarrow may quote the URI
        raise ConfigError(f"--ray-storage {redact_uri(text)!r}: not a storage URI pyarrow can "
                          f"open ({why})") from None
    return text


__all__ = ["check_datasets", "check_devices", "check_model", "check_pretrained",
           "check_one_batch", "check_ray_address", "check_ray_storage", "check_sweep_name",
           "check_trials_fit", "note_fewer_shots"]
