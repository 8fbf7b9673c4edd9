"""Error types: every user-facing failure is a VacsrError with a one-line message."""


class VacsrError(Exception):
    """Base class for errors the user can fix (bad config, bad data, bad path)."""


class ConfigError(VacsrError):
    """A config key or value is unknown or invalid."""


class DataError(VacsrError):
    """A dataset file or folder is missing, malformed or unreadable."""


class CheckpointError(VacsrError):
    """A checkpoint is missing, truncated or does not match the model."""


class StorageError(VacsrError):
    """A file cannot be written: the disk is full, read-only or failing."""


class TrainingDiverged(VacsrError):
    """The loss went non-finite: the same config and seed diverge again, so retrying is futile."""


class UsageError(VacsrError):
    """A command-line flag is missing, unknown or has an invalid value."""


class RunFailed(VacsrError):
    """A training run ended by an error of its own (recorded by its workers)."""
