"""The OpenSearch security configuration (``Custom::OpenSearchSecurityConfig``): maps the
functions' roles and enables audit logs as the domain's master user (``engram_memory.cloud.opensearch_security``)."""

from engram_memory.cloud.opensearch_security import SecurityConfigResource

handler = SecurityConfigResource()
