"""clusterfed: clustered federated learning, one algorithm code for a simulator and for Flower."""

from clusterfed.errors import ClusterfedError, ConfigError, DataError

__version__ = "0.1.0"
__all__ = ["ClusterfedError", "ConfigError", "DataError", "__version__"]
