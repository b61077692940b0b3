"""URL-mode confirmations: the approval page (``engram_memory.cloud.approval_page``)."""

from engram_memory.cloud.approval_page import ApprovalHandler

handler = ApprovalHandler()
