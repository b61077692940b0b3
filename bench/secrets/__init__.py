"""The secret-gate benchmark (see ``evaluate``; run ``python -m bench.secrets``)."""
