"""The console over HTTP: sign-in, sessions, CSRF, headers, and the pages' starlette routes.

- ``GET /console/signin/{secret}`` redeems a one-time link (``links.SignInLinks``, minted by
  ``engram-memory console`` or the ``serve`` banner) for a session cookie: HttpOnly,
  SameSite=Strict, Path=/console, as long as the session (``sessions.SESSION_TTL_MS``).
- Every other page needs that cookie; nothing else opens it (an agent's bearer token is not
  looked at). Every form carries the session's CSRF token and is refused without it, or from
  another origin.
- Loopback clients only, unless ``host.json`` sets ``console_remote`` (e.g. behind a proxy);
  the ``Host`` header must name this server, as for ``/mcp`` and the approval page.
- Every response: ``Cache-Control: no-store``, a strict CSP (no script at all), no referrer.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio.to_thread
import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from engram_memory.adapters.lazy import Lazy
from engram_memory.approval_page import DECISION_STYLE, read_form, same_origin
from engram_memory.binding.host_config import host_matches
from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.embedded.console import pages
from engram_memory.embedded.console.links import SignInLinks
from engram_memory.embedded.console.sessions import Session, Sessions
from engram_memory.operator_plane.commands import command_name
from engram_memory.operator_plane.seat import SeatFailure, UsageError

if TYPE_CHECKING:
    from engram_memory.embedded.book_channel import EmbeddedApprovals
    from engram_memory.embedded.composition import EmbeddedHost
    from engram_memory.engine.ports import Clock
    from engram_memory.operator_plane.seat import OperatorSeat

CONSOLE_PATH: Final = "/console"
COOKIE: Final = "engram_console"
CSRF_FIELD: Final = "csrf_token"
MAX_FORM_BYTES: Final = 8192
CSP: Final = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self';"
    " frame-ancestors 'none'; base-uri 'none'"
)
HEADERS: Final = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": CSP,
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}
# EngramError codes as HTTP statuses (the rest: 409, the request cannot be done as asked)
_STATUS: Final = {ErrorCode.NOT_FOUND.value: 404, ErrorCode.INVALID_SCHEMA.value: 400}
log = logging.getLogger(__name__)


class Console:
    """The console of one running server: its data directory's sign-in links, its sessions, the
    seat each page acts on (the server's engine, as the signed-in operator)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        opened: Callable[[], EmbeddedHost],
        approvals: EmbeddedApprovals,
        csrf_key: bytes,
        remote: bool = False,
    ) -> None:
        """``approvals``: the server's approval channel (whose clock the console keeps)."""
        self.data_dir = Path(data_dir)
        self._opened = opened
        self.approvals = approvals
        self.clock: Clock = approvals.clock
        self.sessions = Sessions(csrf_key)
        self.remote = remote
        self._links = Lazy(lambda: SignInLinks(self.data_dir))
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("engram_memory.embedded.console", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )

    @property
    def links(self) -> SignInLinks:
        """The data directory's sign-in links, opened on first use."""
        return self._links.get()

    def close(self) -> None:
        self._links.close()

    def seat(self, operator: str) -> OperatorSeat:
        from engram_memory.embedded.operator_seat import DataDirSeat

        return DataDirSeat(self.data_dir, operator, opened=self._opened)

    def render(
        self, template: str, status: int = 200, session: Session | None = None, /, **values: Any
    ) -> Response:
        html = self.templates.get_template(template).render(
            session=session, link=pages.link, command=command_name(), **values
        )
        return HTMLResponse(html, status, headers=HEADERS)

    def refused(self, status: int, title: str, detail: str) -> Response:
        return self.render("message.html", status, title=title, detail=detail)


def _loopback(request: Request) -> bool:
    client = request.client
    try:
        return client is not None and ipaddress.ip_address(client.host).is_loopback
    except ValueError:
        return False


def _sign_in_again() -> str:
    return f"Run `{command_name()} console` on the host and open the link it prints."


def _admitted(console: Console, request: Request, hosts: list[str]) -> Response | None:
    """A refusal for a request the console does not take at all (wrong Host, remote client)."""
    if not host_matches(request.headers.get("host", ""), hosts):
        return console.refused(421, "Wrong address", "This server does not answer that host.")
    if not console.remote and not _loopback(request):
        return console.refused(
            403,
            "Console not reachable from here",
            "The console answers this machine only; set console_remote in host.json to change"
            " that.",
        )
    return None


def _signed_in(console: Console, request: Request) -> Session | Response:
    session = console.sessions.find(request.cookies.get(COOKIE), console.clock.now_ms())
    if session is None:
        return console.refused(401, "Sign in to the console", _sign_in_again())
    return session


def _form_refusal(
    console: Console, request: Request, session: Session, form: Any
) -> Response | None:
    """Why a POST is refused: too large, from another site, or without the session's token."""
    if form is None:
        return console.refused(413, "Form too large", "Send less text.")
    own_origin = f"{request.url.scheme}://{request.headers.get('host', '')}"
    sent = form.get(CSRF_FIELD, "")
    if (
        not same_origin(
            request.headers.get("origin"), request.headers.get("sec-fetch-site"), own_origin
        )
        or not sent
        or not hmac.compare_digest(sent.encode(), session.csrf.encode())
    ):
        return console.refused(
            403,
            "Form refused",
            "The form was not sent from this console; reload the page and try again.",
        )
    return None


def _failure(console: Console, ask: pages.Ask, error: Exception) -> Response:
    session, workspace = ask.session, ask.workspace
    if isinstance(error, EngramError):
        code = error.code.value
        detail = str(getattr(error, "detail", "") or error.message)
        return console.render(
            "message.html",
            _STATUS.get(code, 409),
            session,
            title=f"Refused: {code}",
            detail=detail,
            workspace=workspace,
        )
    return console.render(
        "message.html", 400, session, title="Refused", detail=str(error), workspace=workspace
    )


async def _checked(
    console: Console, request: Request, hosts: list[str]
) -> tuple[Session, dict[str, str]] | Response:
    """The request's session and its form (a POST's, checked), or the refusal to send."""
    refusal = _admitted(console, request, hosts)
    if refusal is not None:
        return refusal
    session = _signed_in(console, request)
    if isinstance(session, Response):
        return session
    if request.method != "POST":
        return session, {}
    form = read_form(await request.body(), limit=MAX_FORM_BYTES)
    refused = _form_refusal(console, request, session, form)
    if refused is not None:
        return refused
    return session, form or {}


def page_route(console: Console, hosts: list[str], method: str, path: str, page: Any) -> Route:
    async def endpoint(request: Request) -> Response:
        checked = await _checked(console, request, hosts)
        if isinstance(checked, Response):
            return checked
        session, form = checked
        ask = pages.Ask(
            session=session,
            seat=console.seat(session.operator),
            approvals=console.approvals,
            now_ms=console.clock.now_ms(),
            data_dir=console.data_dir,
            query=dict(request.query_params),
            path={name: str(value) for name, value in request.path_params.items()},
            form=form,
        )
        try:
            answer = await anyio.to_thread.run_sync(page, ask)
        except (EngramError, SeatFailure, UsageError) as error:
            return _failure(console, ask, error)
        if isinstance(answer, pages.Redirect):
            return RedirectResponse(answer.location, 303, headers=HEADERS)
        return console.render(
            answer.template, answer.status, session, workspace=ask.workspace, **answer.values
        )

    return Route(CONSOLE_PATH + path, endpoint=endpoint, methods=[method])


def _sign_in_route(console: Console, hosts: list[str]) -> Route:
    async def sign_in(request: Request) -> Response:
        refusal = _admitted(console, request, hosts)
        if refusal is not None:
            return refusal
        now_ms = console.clock.now_ms()
        operator = await anyio.to_thread.run_sync(
            console.links.redeem, request.path_params["secret"], now_ms
        )
        if operator is None:
            return console.refused(
                403,
                "This sign-in link cannot be used",
                "It was used already or has expired. " + _sign_in_again(),
            )
        cookie, session = console.sessions.open(operator, now_ms)
        response = RedirectResponse(CONSOLE_PATH + "/", 303, headers=HEADERS)
        response.set_cookie(
            COOKIE,
            cookie,
            max_age=(session.expires_at_ms - now_ms) // 1000,
            path=CONSOLE_PATH,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        log.info("console: %s signed in", operator)
        return response

    return Route(CONSOLE_PATH + "/signin/{secret}", endpoint=sign_in, methods=["GET"])


def _sign_out_route(console: Console, hosts: list[str]) -> Route:
    async def sign_out(request: Request) -> Response:
        checked = await _checked(console, request, hosts)
        if isinstance(checked, Response):
            return checked
        console.sessions.close(request.cookies.get(COOKIE))
        response = console.refused(200, "Signed out", _sign_in_again())
        response.delete_cookie(COOKIE, path=CONSOLE_PATH)
        return response

    return Route(CONSOLE_PATH + "/signout", endpoint=sign_out, methods=["POST"])


def _style_route() -> Route:
    css = resources.files("engram_memory.embedded.console").joinpath("static/console.css")

    # approve/decline in the approval page's colours, one language for both
    served = css.read_bytes() + DECISION_STYLE.encode()

    async def style(_request: Request) -> Response:
        return Response(served, media_type="text/css", headers=HEADERS)

    return Route(CONSOLE_PATH + "/console.css", endpoint=style, methods=["GET"])


def console_routes(console: Console, allowed_hosts: list[str]) -> list[Route]:
    """The console's routes on the embedded server (``/console/...``)."""
    return [
        _sign_in_route(console, allowed_hosts),
        _sign_out_route(console, allowed_hosts),
        _style_route(),
        *(
            page_route(console, allowed_hosts, method, path, page)
            for path, methods in pages.PAGES.items()
            for method, page in methods.items()
        ),
        _not_found_route(console),
    ]


def _not_found_route(console: Console) -> Route:
    """Any other path under /console: a page that says so, with the console's headers."""

    async def not_found(_request: Request) -> Response:
        return console.refused(404, "No such page", "Go back to the console's overview.")

    return Route(CONSOLE_PATH + "/{rest:path}", endpoint=not_found, methods=["GET", "POST"])


def sign_in_link(data_dir: Path, origin: str, operator: str, now_ms: int) -> str:
    """Mint a one-time link for ``operator`` in ``data_dir``: the URL to open (``origin``: the
    server's ``scheme://host:port``)."""
    links = SignInLinks(data_dir)
    try:
        secret = links.mint(operator, now_ms)
    finally:
        links.close()
    return f"{origin.rstrip('/')}{CONSOLE_PATH}/signin/{secret}"


__all__ = ["CONSOLE_PATH", "COOKIE", "Console", "console_routes", "sign_in_link"]
