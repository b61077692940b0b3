"""Fixtures of the integration suite: defined (and type-checked) in ``aws_testing``."""

from aws_testing import aws

__all__ = ["aws"]
