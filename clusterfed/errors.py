"""The errors a user can cause. The command line prints their message as one line."""


class ClusterfedError(Exception):
    """Base of every error that is the user's to fix (bad config, missing data, ...)."""


class ConfigError(ClusterfedError, ValueError):
    """An unknown name or key, or an impossible combination of settings."""


class DataError(ClusterfedError, OSError):
    """A data file is missing or its content does not match its checksum."""
