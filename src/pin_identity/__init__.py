"""pin-identity: background jobs of the identity service."""

__version__ = "0.1.0"
