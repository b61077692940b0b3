"""Every function of the template, run from the ``sam build`` output, against moto out of process.

The harness (this process, the tool venv) holds everything that is not the product:

- **moto** as a server (``ThreadedMotoServer``) for DynamoDB, S3, KMS, Secrets Manager and Step
  Functions; moto runs the real ASL of ``infra/statemachines`` (``execute_state_machine``). The
  resources are the template's: tables with the template's key schema, the KMS key, generated
  secrets, the two state machines with the template's ``DefinitionSubstitutions``.
- **the Lambda service**: an HTTP endpoint speaking Lambda's ``Invoke`` API. The adapter's boto3
  client reaches it through ``AWS_ENDPOINT_URL_LAMBDA``; moto's Step Functions interpreter reaches
  it for its Lambda tasks. Each invocation goes to the function's **worker**: a
  ``python3.12 -I -S scripts/lambda_worker.py`` process whose ``sys.path`` is only
  ``.aws-sam/build/<Function>``, the built layer's ``python/`` and a runtime boto3 directory.
- **the identity provider**: an Ed25519 issuer whose OIDC discovery document and JWKS are served
  over HTTPS (a throw-away CA the workers trust through ``SSL_CERT_FILE``/``REQUESTS_CA_BUNDLE``);
  the adapter finds the JWKS through the discovery document, as it does in AWS.
- **OpenSearch**: a fake that answers the subset of the REST API the index adapter sends (signed,
  gzip-compressed requests from opensearch-py, over HTTPS): create index, index/get/delete a
  document, ``_bulk``, ``_search`` (term filters, ``match`` clauses by field boost, a plain
  term-count score; not BM25), ``_refresh``. Any other request is answered 400 and counted as a
  failure, so a request shape the fake does not know cannot pass unnoticed. Real OpenSearch is
  exercised only by the live test (``ENGRAM_OPENSEARCH_URL``).

Each function's environment is the template's (``Globals`` and its own), with every intrinsic
resolved against these resources; a ``Ref`` the harness cannot resolve fails the gate. Then:

1. **smoke**: every ``AWS::Serverless::Function`` needs ``events/<folder>.json`` or
   ``events/<folder>_*.json`` (``folder`` = its ``CodeUri``); each sample is invoked; the handler
   must import and answer, and every module it loaded outside the standard library must come from
   its build folder, the layer or the runtime directory;
2. **flow**: the adapter receives API Gateway HTTP API v2 events and drives initialize,
   tools/list, capture, request_admission, search, get, withdraw (form mode, 2026-07-28, the
   withdraw state machine runs) and forget (URL mode, 2025-11-25: the approval page is the built
   approval function, the forget state machine runs), then search and get see the record gone;
3. **the operator**: the real ``engram-memory admin --stack`` CLI (the project venv's) against
   the stack registered in moto's CloudFormation, signed with the operator's key: every command
   that works against a stack, each ``--json`` document read for what it did (``operator_cli``);
4. **the smoke command** (``admin --stack ... smoke``) through the HTTP API's stand-in, the
   harness approving on the page as a browser would when it prints the link (``operator_smoke``).

Like Lambda, the Lambda service writes each invocation's ``START``/``END``/``REPORT`` lines to
the function's log group in moto's CloudWatch Logs.

Output: ``  ok   ...`` / ``  FAIL ...`` lines; exit 1 on a FAIL.

One module per concern: ``settings`` (names and paths), ``moto_server``, ``stack`` (the
template's resources and intrinsics, the stack in moto's CloudFormation), ``lambdas`` (the
Lambda service and its workers), ``identity`` (TLS and the issuer), ``opensearch`` (the fake
domain), ``endpoints`` (the HTTPS server), ``api_gateway`` (the HTTP API's stand-in), ``tally``
(what each phase cost), ``harness`` (set-up and tear-down), ``smoke``, ``mcp`` (the client side),
``approval`` (the approval page as a browser uses it), ``flow``, ``operator_shell`` (the CLI in
the operator's shell), ``operator_cli`` (the operator's commands; not ``operator``, which would
shadow the standard library's when the folder runs as a script), ``operator_smoke``, ``cli``; ``recorder``, ``iam``, ``judge``, ``probes`` and
``permissions`` (every AWS call per principal, and the IAM judge over them).

Usage: python scripts/cloud_run --build-dir DIR --python312 PATH --runtime-dir DIR [--logs DIR]
"""

from .cli import main
from .identity import self_signed

__all__ = ["main", "self_signed"]
