"""The operator console: a browser front end of the operator plane, served by the embedded
``serve`` under ``/console`` on its own port (never with an agent's token).

- ``links``: one-time sign-in links in the data directory (minted by ``engram-memory console``
  and the ``serve`` banner, redeemed by the server), stored hashed;
- ``sessions``: the server's sessions (cookie, operator, expiry, CSRF token);
- ``pages``: each page over the operator plane's use cases on an ``OperatorSeat``;
- ``app``: sign-in, CSRF, headers and the starlette routes; ``templates/``: Jinja2, no script.
"""
