"""Admission policies (CONTRACT.md §7.4, §9).

``builtin.BuiltinAdmissionPolicy`` is the policy the host gets by default: it rejects content that
must never be stored (secrets found by ``secrets.SecretScanner``, the host's own binding facts),
applies the host's declarative rules (``builtin.HostRule``), and either accepts or asks for manual
adjudication. Every decision names the rule that decided by an identifier, never by content.
"""
