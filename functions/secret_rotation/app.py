"""Rotation of the stack's secrets (``engram_memory.cloud.secret_rotation``)."""

from engram_memory.cloud.secret_rotation import rotation_handler

handler = rotation_handler()
