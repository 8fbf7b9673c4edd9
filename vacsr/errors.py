"""Error types: every user-facing failure is a VacsrError with a one-line message."""


class VacsrError(Exception):
    """Base class for errors the user can fix (bad config, bad data, bad path)."""


class ConfigError(VacsrError):
    """A config key or value is unknown or invalid."""


class DataError(VacsrError):
    """A dataset file or folder is missing, malformed or unreadable."""


class CheckpointError(VacsrError):
    """A checkpoint is missing, truncated or does not match the model."""
