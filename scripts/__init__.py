"""The repository's tools (the cloud gate, the dev environment); importable as ``scripts``."""
