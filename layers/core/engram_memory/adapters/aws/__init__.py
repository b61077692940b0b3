"""Cloud adapters on AWS: DynamoDB store, KMS vault, and their helpers."""
