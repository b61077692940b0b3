"""Rotation of the approval page's session secret (``engram_memory.cloud.session_rotation``)."""

from engram_memory.cloud.session_rotation import rotation_handler

handler = rotation_handler()
